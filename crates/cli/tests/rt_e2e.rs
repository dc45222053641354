//! End to end: `spillway run` with real applications in network namespaces. Each test writes a
//! testbed with names unique to the test and process, starts the real binary, runs nginx + wrk,
//! redis + redis-benchmark, iperf3 or a long-lived Python client inside the namespaces, drives
//! the lifecycle with `spillway ctl`, and checks what the applications saw (requests served,
//! every reply received, transfers completed) and what the fabric reports; on the way out it
//! stops the daemon with SIGINT and checks that no namespace, cgroup, process or ledger is left.
//! One test floods the bed with `spillway traffic gen` and checks that the DPU process's
//! forwarding thread allocates nothing per frame (`forwarding_allocs` in `ctl status`). The
//! tests named `two_forwarding_threads_*` run the same checks with the DPU's connections split
//! over two forwarding threads (`fabric.dpu.shards = 2`).
//!
//! Needs root and the programs (`.ci/run` installs them). Under `CI=true` a missing one fails
//! the test; elsewhere the test prints why it skips. The tests take a global lock so their
//! measurements do not compete for the machine's two cores.

#[allow(dead_code)]
mod common;

use spillway_testkit::process_alive;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());
static NEXT: AtomicU32 = AtomicU32::new(0);

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// DPU limits scaled so that the applications saturate it: a slow path of about 2,000
/// connections/s, a 30 kpps fast path.
const LIMITED: &str = r#"
[fabric.dpu]
hw_pps_limit = 30000.0
hw_entries_max = HW_ENTRIES
insert_rate_limit = 5000.0
soc_cores = 1
soc_new_conn_cost = "500us"
soc_miss_cost = "20us"
[fabric.host]
pkt_cost = "100ns"
new_conn_cost = "1us"
heartbeat = "100ms"
"#;

/// A testbed instance: two VMs `a` (10.66.0.1) and `b` (10.66.0.2), daemon running.
struct Bed {
    name: String,
    dir: tempfile::TempDir,
    config: PathBuf,
    daemon: Option<Child>,
    apps: Vec<Child>,
}

impl Bed {
    fn ns(&self, vm: &str) -> String {
        format!("{}-{vm}", self.name)
    }

    fn start(hold: &str, hw_entries: u32) -> Bed {
        Bed::start_with(hold, hw_entries, "", "")
    }

    /// A bed whose `[[vm]]`s carry `vm_extra` (e.g. `backend = "shm"`) and whose
    /// `[fabric.host]` carries `host_extra`.
    fn start_with(hold: &str, hw_entries: u32, vm_extra: &str, host_extra: &str) -> Bed {
        Bed::start_config(hold, hw_entries, vm_extra, host_extra, 30_000)
    }

    /// [`Bed::start_with`] with a fast path of `hw_pps` packets per second instead of 30 kpps.
    fn start_config(
        hold: &str,
        hw_entries: u32,
        vm_extra: &str,
        host_extra: &str,
        hw_pps: u32,
    ) -> Bed {
        let mut bed = Bed::configure(hw_entries, vm_extra, host_extra, hw_pps);
        bed.spawn(hold);
        bed
    }

    /// [`Bed::start_config`] with the DPU's connections split over `shards` forwarding
    /// threads (`fabric.dpu.shards`; 1 is today's one thread).
    fn start_sharded(hold: &str, hw_entries: u32, hw_pps: u32, shards: u32) -> Bed {
        Bed::start_sharded_with(hold, hw_entries, hw_pps, shards, "")
    }

    /// [`Bed::start_sharded`] whose `[fabric.host]` carries `host_extra`.
    fn start_sharded_with(
        hold: &str,
        hw_entries: u32,
        hw_pps: u32,
        shards: u32,
        host_extra: &str,
    ) -> Bed {
        Bed::start_sharded_vms(hold, (hw_entries, hw_pps), shards, "", host_extra)
    }

    /// [`Bed::start_sharded_with`] whose VMs' tables carry `vm_extra`.
    fn start_sharded_vms(
        hold: &str,
        (hw_entries, hw_pps): (u32, u32),
        shards: u32,
        vm_extra: &str,
        host_extra: &str,
    ) -> Bed {
        let mut bed = Bed::configure(hw_entries, vm_extra, host_extra, hw_pps);
        let text = std::fs::read_to_string(&bed.config).unwrap();
        let text = text.replacen(
            "[fabric.dpu]\n",
            &format!("[fabric.dpu]\nshards = {shards}\n"),
            1,
        );
        std::fs::write(&bed.config, text).unwrap();
        bed.spawn(hold);
        if shards > 1 {
            assert_eq!(bed.status()["forwarding_threads"], shards, "{}", bed.log());
        }
        bed
    }

    /// [`Bed::start_config`]'s testbed file, written but not started.
    fn configure(hw_entries: u32, vm_extra: &str, host_extra: &str, hw_pps: u32) -> Bed {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("e{:x}", (std::process::id() % 0xffff) * 16 + n % 16);
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("testbed.toml");
        let text = format!(
            r#"
[testbed]
name = "{name}"
state_dir = "{state}"
[ops]
metrics_addr = "127.0.0.1:0"
[spill]
cpus = "1"
memory_max = "512M"
{limited}
{policy}
[[vm]]
name = "a"
port = 1
{vm_extra}
[[vm]]
name = "b"
port = 2
{vm_extra}
"#,
            policy = common::two_port_policy("10.66.0", Some("any")),
            state = dir.path().display(),
            limited = LIMITED
                .replace("HW_ENTRIES", &hw_entries.to_string())
                .replace(
                    "hw_pps_limit = 30000.0",
                    &format!("hw_pps_limit = {hw_pps}.0")
                )
                .replace(
                    "heartbeat = \"100ms\"",
                    &format!("heartbeat = \"100ms\"\n{host_extra}")
                ),
        );
        std::fs::write(&config, text).expect("write testbed");
        Bed {
            name,
            dir,
            config,
            daemon: None,
            apps: Vec::new(),
        }
    }

    /// Starts `spillway run` on this bed's testbed and waits until it is ready.
    fn spawn(&mut self, hold: &str) {
        let within = Duration::from_secs(30);
        let d = common::spawn_run(BIN, &self.config, self.dir.path(), hold, "warn", within);
        self.daemon = Some(d);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// A command run inside VM `vm`'s namespace.
    fn exec(&self, vm: &str, program: &str) -> Command {
        common::netns_exec(&self.ns(vm), program)
    }

    /// A `spillway traffic sink` on 10.66.0.2:9000 in `b`, killed when the bed goes.
    fn udp_sink(&mut self) {
        let args = [
            "traffic",
            "sink",
            "--bind",
            "10.66.0.2:9000",
            "--idle",
            "30",
        ];
        self.server("b", BIN, &args);
    }

    /// `spillway traffic gen` from `a` to the sink: `flows` flows of 64-byte datagrams at `pps`
    /// for `secs` seconds, its JSON report on stdout.
    fn udp_flood(&self, flows: u32, pps: u32, secs: u32) -> Child {
        let (flows, pps, secs) = (flows.to_string(), pps.to_string(), secs.to_string());
        self.exec("a", BIN)
            .args(["traffic", "gen", "--dst", "10.66.0.2:9000"])
            .args([
                "--flows",
                &flows,
                "--rate",
                &pps,
                "--duration",
                &secs,
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn traffic gen")
    }

    /// Starts a server in `vm`, killed when the bed goes.
    /// Starts `program` in `vm` in a process group of its own, so that stopping it also stops
    /// what it forked (nginx's worker outlives a killed master otherwise).
    fn server(&mut self, vm: &str, program: &str, args: &[&str]) {
        use std::os::unix::process::CommandExt;
        let child = self
            .exec(vm, program)
            .args(args)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn server");
        self.apps.push(child);
    }

    fn nginx(&mut self) {
        let d = self.dir.path();
        let conf = d.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx.err;\ndaemon off;\n\
                 events {{ worker_connections 1024; }}\nhttp {{ access_log off;\n\
                 client_body_temp_path {d}/b; proxy_temp_path {d}/p; fastcgi_temp_path {d}/f;\n\
                 uwsgi_temp_path {d}/u; scgi_temp_path {d}/s;\n\
                 server {{ listen 8080; location / {{ return 200 \"hello\\n\"; }} }} }}\n",
                d = d.display()
            ),
        )
        .unwrap();
        self.server("b", "nginx", &["-c", conf.to_str().unwrap()]);
        self.wait_port("b", 8080);
    }

    fn redis(&mut self) {
        self.server("b", "redis-server", common::REDIS_ARGS);
        self.wait_port("b", 6380);
    }

    fn iperf3_server(&mut self) {
        self.server("b", "iperf3", &["-s", "-p", "5201"]);
        self.wait_port("b", 5201);
    }

    fn wait_port(&self, vm: &str, port: u16) {
        common::wait_listening(&self.ns(vm), port);
    }

    fn ctl(&self, args: &[&str]) -> serde_json::Value {
        common::ctl(BIN, &self.config, args)
    }

    /// A copy of the binary under test named `name` in this bed's directory, with `mode`
    /// (an upgrade's new binary).
    fn binary_copy(&self, name: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = self.dir.path().join(name);
        std::fs::copy(BIN, &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn status(&self) -> serde_json::Value {
        self.ctl(&["status"])
    }

    fn wait_phase(&self, phase: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status();
            if s["phase"] == phase {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "phase {} after {within:?}, wanted {phase}: {s:#}",
                s["phase"]
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the daemon with SIGINT and checks that nothing of the testbed is left.
    fn stop_and_check_clean(mut self) {
        self.stop();
        let ns = String::from_utf8(
            Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(!ns.contains(&self.name), "namespaces left: {ns}");
        let ledger = self.dir.path().join(format!("{}.ledger", self.name));
        assert!(!ledger.exists(), "ledger left");
        for ctrl in ["cpuset", "memory"] {
            let p = Path::new("/sys/fs/cgroup")
                .join(ctrl)
                .join("spillway")
                .join(format!("{}-plane", self.name));
            assert!(!p.exists(), "cgroup left: {}", p.display());
        }
        // No process of this testbed's plane or VM endpoints is left (read from /proc: procps
        // may be absent).
        for what in ["spill-plane", "vm-endpoint"] {
            let left = processes_with(&format!("{what}\0--config\0{}", self.config.display()));
            assert!(left.is_empty(), "{what} processes left: {left:?}");
        }
    }

    /// Runs `spillway vm-endpoint` for VM `vm` with `args`, in the background.
    fn endpoint(&self, vm: &str, args: &[&str]) -> Child {
        Command::new(BIN)
            .args(["vm-endpoint", "--config"])
            .arg(&self.config)
            .args(["--vm", vm, "--buf-bytes", "2048", "--log", "warn"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vm-endpoint")
    }

    /// Waits until the plane's statistics (sent every 500 ms) show `key` at least `min`.
    fn wait_plane_counter(&self, key: &str, min: u64, within: Duration) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let s = self.status();
            if plane_counter(&s, key) >= min {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "plane counter {key} < {min} after {within:?}: {s:#}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn stop(&mut self) {
        self.stop_apps();
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: signalling our own unreaped child.
            unsafe {
                libc::kill(d.id() as i32, libc::SIGINT);
            }
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                match d.try_wait().unwrap() {
                    Some(s) => {
                        assert!(s.success(), "spillway run exited with {s}: {}", self.log());
                        break;
                    }
                    None if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    None => {
                        let _ = d.kill();
                        let _ = d.wait();
                        panic!("spillway run did not stop on SIGINT: {}", self.log());
                    }
                }
            }
        }
    }
}

impl Bed {
    /// Kills every application with everything it forked: each leads its own process group
    /// ([`Bed::server`]).
    fn stop_apps(&mut self) {
        for mut a in self.apps.drain(..) {
            // SAFETY: signalling the process group led by our own unreaped child.
            unsafe {
                libc::kill(-(a.id() as i32), libc::SIGKILL);
            }
            let _ = a.kill();
            let _ = a.wait();
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if self.daemon.is_some() || !self.apps.is_empty() {
            // A failed test: stop everything; the daemon's own cleanup removes the testbed.
            self.stop_apps();
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
                    .args(["netns", "del", &self.ns(vm)])
                    .status();
            }
        }
    }
}

/// Pids whose command line contains `needle` (arguments separated by NUL).
fn processes_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(needle)
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// wrk's requests/s and its error line.
fn wrk(bed: &Bed, close: bool, conns: u32, secs: u32) -> (f64, String) {
    let mut c = bed.exec("a", "wrk");
    c.args(["-t1", &format!("-c{conns}"), &format!("-d{secs}")]);
    if close {
        c.args(["-H", "Connection: close"]);
    }
    let o = c.arg("http://10.66.0.2:8080/").output().unwrap();
    let text = stdout(&o);
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("wrk output: {text} {}", String::from_utf8_lossy(&o.stderr)));
    let errors = text
        .lines()
        .filter(|l| l.contains("errors") || l.contains("Non-2xx"))
        .collect::<Vec<_>>()
        .join("; ");
    (rps, errors)
}

/// Two long-lived connections for the length of a test: the redis pinger and a 20 Mbit/s
/// iperf3 TCP transfer (one-second intervals).
struct LongLived {
    pinger: Child,
    iperf: Child,
}

impl LongLived {
    fn start(bed: &Bed, secs: u32) -> LongLived {
        let pinger = common::redis_pinger(&bed.ns("a"), "10.66.0.2:6380", secs, 3);
        let iperf = bed
            .exec("a", "iperf3")
            .args(["-c", "10.66.0.2", "-p", "5201", "-J", "-b", "20M", "-t"])
            .arg(secs.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        LongLived { pinger, iperf }
    }

    /// Waits for both; returns the PONGs received and the starts of the iperf3 intervals that
    /// carried no data. Panics if either connection broke.
    fn finish(self) -> (u64, Vec<f64>) {
        let (pongs, stalled, _) = self.finish_with_gap();
        (pongs, stalled)
    }

    /// [`LongLived::finish`], with the longest time between two PONGs, in ms.
    fn finish_with_gap(self) -> (u64, Vec<f64>, f64) {
        let out = common::finish(self.pinger, "redis pinger");
        let mut words = out.split_whitespace();
        let pongs = words.next().and_then(|w| w.parse().ok()).unwrap();
        let gap_ms = words.next().and_then(|w| w.parse().ok()).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&common::finish(self.iperf, "iperf3")).unwrap();
        let stalled = v["intervals"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["sum"]["bytes"].as_f64().unwrap_or(0.0) == 0.0)
            .map(|i| i["sum"]["start"].as_f64().unwrap_or(-1.0))
            .collect();
        (pongs, stalled, gap_ms)
    }
}

/// A paced UDP flood of many flows from `a` to a sink in `b` (`spillway traffic gen|sink`):
/// with several forwarding threads its flows spread over every shard, so every thread's lanes
/// carry some of it. The sink stops a second after the flood.
struct UdpProbe {
    sink: Child,
    sender: Child,
}

impl UdpProbe {
    fn start(bed: &Bed, flows: u32, pps: u32, secs: u32) -> UdpProbe {
        let sink = bed
            .exec("b", BIN)
            .args(["traffic", "sink", "--bind", "10.66.0.2:9000", "--idle", "1"])
            .arg("--json")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn traffic sink");
        std::thread::sleep(Duration::from_millis(200));
        let sender = bed.udp_flood(flows, pps, secs);
        UdpProbe { sink, sender }
    }

    /// A probe of 32 flows at 2 kpps for `secs` seconds, running once every one of the
    /// `shards` shards holds some of its flows (with two, all on one: 1 in 2^31), so that what
    /// happens to a plane is seen on every forwarding thread's lanes.
    fn on_every_shard(bed: &Bed, shards: u32, secs: u32) -> UdpProbe {
        let p = UdpProbe::start(bed, 32, 2000, secs);
        std::thread::sleep(Duration::from_millis(800));
        let per = bed.status()["conns_per_thread"].clone();
        let per: Vec<u64> = serde_json::from_value(per).unwrap();
        assert_eq!(per.len(), shards as usize, "{per:?}");
        assert!(
            per.iter().all(|&n| n > 0),
            "connections on every shard: {per:?}"
        );
        p
    }

    /// Waits for the probe: every datagram sent arrived. What a killed or stalled plane never
    /// took is taken back from every thread's lane of it once it is reaped, and what was
    /// steered to it during the flip is kept and offered again once the warm plane's lanes
    /// are live. `s` is a status from after the failover, for the figures.
    fn check_nothing_lost(self, s: &serde_json::Value) {
        let (sent, r) = self.finish();
        eprintln!(
            "UDP probe: sent {}, {r}; reclaimed {}, past the bound {}, steered to no plane {}",
            sent["sent"],
            counter(s, "rt.plane.reclaimed"),
            counter(s, "rt.plane.reclaim_dropped"),
            counter(s, "rt.drop.plane_gone")
        );
        assert_eq!(r["flows"], 32, "{r}");
        assert_eq!(
            r["received"], sent["sent"],
            "sent {sent}; {r}; drops {}, vSwitch drops {}, counters {}",
            s["drops"], s["vswitch_drops"], s["counters"]
        );
    }

    /// The generator's and the sink's reports once both are done.
    fn finish(self) -> (serde_json::Value, serde_json::Value) {
        let sent =
            serde_json::from_str(&common::finish(self.sender, "traffic gen")).expect("gen JSON");
        let got =
            serde_json::from_str(&common::finish(self.sink, "traffic sink")).expect("sink JSON");
        (sent, got)
    }
}

fn iperf3_json(bed: &Bed, args: &[&str]) -> serde_json::Value {
    let o = bed
        .exec("a", "iperf3")
        .args(["-c", "10.66.0.2", "-p", "5201", "-J"])
        .args(args)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("iperf3 JSON");
    assert!(v.get("error").is_none(), "iperf3: {}", v["error"]);
    v
}

#[test]
fn testbed_carries_traffic_serves_ctl_and_metrics_and_leaves_nothing_behind() {
    if !spillway_testkit::prerequisites(&["ip", "iperf3", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start("auto", 2000);
    bed.iperf3_server();
    let run = bed
        .exec("a", "iperf3")
        .args(["-c", "10.66.0.2", "-p", "5201", "-J", "-t", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // The flow dump names the transfer's connections and their owners while it runs.
    let flows = bed.ctl(&["flows"]);
    let v: serde_json::Value = serde_json::from_str(&common::finish(run, "iperf3")).unwrap();
    let gbps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
        / 1e9;
    assert!(gbps > 0.05, "TCP through the fabric: {gbps} Gbit/s");
    let s = bed.status();
    assert!(
        s["counters"]["rt.tx.frames"].as_u64().unwrap() > 1000,
        "{s:#}"
    );
    // The metrics endpoint serves the same counters.
    let addr = s["metrics_addr"].as_str().unwrap().to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    use std::io::Write;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).unwrap();
    assert!(body.contains("spillway_dpu_rx_packets_total"), "{body}");
    assert!(body.contains("spillway_fabric_phase{phase="), "{body}");
    // Delivery and loss by tenant are in `ctl status` (root only), never on /metrics.
    assert!(!body.contains("tenant=\""), "{body}");
    let tenants = s["tenants"].as_array().expect("tenants in ctl status");
    assert!(
        tenants
            .iter()
            .any(|t| t["tenant"] == 1 && t["delivered"].as_u64().unwrap_or(0) > 1000),
        "{s:#}"
    );
    let rows = flows["flows"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["flow"].as_str().is_some_and(|f| f.contains(":5201"))
                && r["owner"]
                    .as_str()
                    .is_some_and(|o| o.starts_with("dpu") || o == "spill")),
        "{flows:#}"
    );
    eprintln!("TCP {gbps:.2} Gbit/s through the fabric (debug build)");
    bed.stop_and_check_clean();
}

#[test]
fn nginx_short_connections_gain_from_the_spill_plane_and_keepalive_still_works() {
    if !spillway_testkit::prerequisites(&["ip", "nginx", "wrk", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut results = Vec::new();
    for hold in ["released", "auto"] {
        let mut bed = Bed::start(hold, 2000);
        bed.nginx();
        let (close_rps, close_err) = wrk(&bed, true, 32, 6);
        let (ka_rps, ka_err) = wrk(&bed, false, 8, 2);
        let s = bed.status();
        eprintln!(
            "hold {hold}: Connection: close {close_rps:.0} req/s [{close_err}], keep-alive {ka_rps:.0} req/s [{ka_err}], activations {}",
            s["activations"]
        );
        let ev: Vec<String> = s["events"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .map(|e| {
                format!(
                    "{:.2} {} {}",
                    e["at_s"].as_f64().unwrap_or(0.0),
                    e["event"].as_str().unwrap_or(""),
                    e["reason"].as_str().unwrap_or("")
                )
            })
            .filter(|l| !l.contains(" quota fast path over"))
            .collect();
        eprintln!(
            "events:\n{}\ndrops {} {} plane {}\ncounters {}",
            ev.join("\n"),
            s["drops"],
            s["vswitch_drops"],
            s["plane"]["stats"]["vswitch_drops"],
            s["counters"]
        );
        assert!(ka_rps > 500.0, "keep-alive through the fabric: {ka_rps}");
        if hold == "auto" {
            assert!(
                !s["activations"].as_array().unwrap().is_empty(),
                "the slow path saturated, so URSched must have activated: {s:#}"
            );
        }
        results.push(close_rps);
        bed.stop_and_check_clean();
    }
    // The DPU's slow path caps new connections near 2,000/s; the plane absorbs the overflow.
    // Locally the gain is 4-6x; the margin is small because this is a timed test on a shared
    // machine (one clean-clone CI run measured 1.29x with a slow cold start): the figure
    // itself is bench/vs-ovs.sh's, this checks that the plane adds capacity at all.
    assert!(
        results[1] > 1.15 * results[0],
        "short-connection CPS with the spill plane {:.0} vs DPU only {:.0}",
        results[1],
        results[0]
    );
}

#[test]
fn redis_benchmark_runs_through_both_modes() {
    if !spillway_testkit::prerequisites(&["ip", "redis-server", "redis-benchmark", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for hold in ["released", "active"] {
        let mut bed = Bed::start(hold, 2000);
        bed.redis();
        let o = bed
            .exec("a", "redis-benchmark")
            .args([
                "-h",
                "10.66.0.2",
                "-p",
                "6380",
                "-t",
                "set,get",
                "-n",
                "20000",
                "-c",
                "16",
                "-q",
                "--csv",
            ])
            .output()
            .unwrap();
        let text = stdout(&o);
        let qps: Vec<f64> = text
            .lines()
            .skip(1)
            .filter_map(|l| l.split(',').nth(1)?.trim_matches('"').parse().ok())
            .collect();
        eprintln!("hold {hold}: redis-benchmark {text}");
        assert_eq!(
            qps.len(),
            2,
            "{text} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(qps.iter().all(|q| *q > 1000.0), "{qps:?}");
        bed.stop_and_check_clean();
    }
}

#[test]
fn iperf3_udp_small_packets_cross_the_spill_plane() {
    if !spillway_testkit::prerequisites(&["ip", "iperf3", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start("active", 2000);
    bed.wait_phase("active", Duration::from_secs(10));
    bed.iperf3_server();
    let v = iperf3_json(&bed, &["-u", "-b", "20M", "-l", "64", "-t", "2"]);
    let bytes = v["end"]["sum"]["bytes"].as_f64().unwrap_or(0.0);
    let lost = v["end"]["sum"]["lost_percent"].as_f64().unwrap_or(100.0);
    eprintln!(
        "UDP 64 B via the plane: {} kpps sent, {lost:.1}% lost",
        bytes / 64.0 / 2.0 / 1e3
    );
    assert!(lost < 50.0, "most small datagrams cross: {lost}% lost");
    let s = bed.status();
    let plane_in = plane_counter(&s, "plane.frames.in");
    assert!(
        plane_in > 1000,
        "the datagrams were steered to the plane: {s:#}"
    );
    bed.stop_and_check_clean();
}

/// Allocations a forwarding thread made in two windows of the same length, and the frames it
/// forwarded in the second: two idle seconds, then two seconds of a paced UDP flood of 8 flows
/// from `a` to a sink in `b` that has been running for a second and a half (flows, conntrack
/// entries and table slots warm). `read` takes (allocations, frames) from a `ctl status`.
fn flood_windows(bed: &mut Bed, read: fn(&serde_json::Value) -> (u64, u64)) -> (u64, u64, u64) {
    bed.udp_sink();
    let idle0 = read(&bed.status());
    std::thread::sleep(Duration::from_secs(2));
    let idle1 = read(&bed.status());
    let flood = bed.udp_flood(8, 20_000, 5);
    std::thread::sleep(Duration::from_millis(1500));
    let busy0 = read(&bed.status());
    std::thread::sleep(Duration::from_secs(2));
    let busy1 = read(&bed.status());
    let sent = common::finish(flood, "traffic gen");
    eprintln!("traffic gen: {sent}");
    (idle1.0 - idle0.0, busy1.0 - busy0.0, busy1.1 - busy0.1)
}

/// The DPU process's forwarding thread allocates nothing per frame in steady state. The
/// binary's allocator counts allocations per thread; `ctl status` reports the forwarding
/// thread's outside its upkeep (`forwarding_allocs`: not metrics publishing, `ctl`, the
/// plane's process). With the plane held off, the flood window ([`flood_windows`]) may
/// allocate at most one more per thousand frames than the idle one.
#[test]
fn the_forwarding_thread_allocates_nothing_per_frame() {
    forwarding_allocates_nothing_per_frame(1);
}

/// The same with two forwarding threads: `forwarding_allocs` sums both, and the flood's frames
/// that arrive on the other shard's thread are handed over in pooled buffers.
#[test]
fn two_forwarding_threads_allocate_nothing_per_frame() {
    forwarding_allocates_nothing_per_frame(2);
}

fn forwarding_allocates_nothing_per_frame(shards: u32) {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start_sharded("released", 2000, 30_000, shards);
    let (idle, busy, frames) = flood_windows(&mut bed, |s| {
        let allocs = s["forwarding_allocs"]
            .as_u64()
            .unwrap_or_else(|| panic!("ctl status reports forwarding_allocs: {s:#}"));
        (allocs, counter(s, "rt.rx.frames"))
    });
    eprintln!(
        "DPU forwarding threads ({shards}): {idle} allocations idle, {busy} over {frames} frames"
    );
    assert!(
        frames >= 10_000,
        "the flood went through the DPU process: {frames} frames"
    );
    assert!(
        busy <= idle + frames / 1000,
        "the forwarding thread allocates per frame: {busy} allocations over {frames} frames, \
         {idle} in an idle window of the same length"
    );
    assert_eq!(bed.status()["phase"], "idle", "the plane stayed off");
    bed.stop_and_check_clean();
}

/// The same for the spill plane's process: with every bucket redirected and a hardware table
/// of two entries (so placement cannot recall the flood's flows), the flood crosses the plane,
/// whose stats (every 500 ms, in `ctl status`) carry its threads' `forwarding_allocs`.
#[test]
fn the_plane_allocates_nothing_per_frame() {
    plane_allocates_nothing_per_frame(1);
}

/// The same with the plane's shards on two threads: the flood's eight flows cross both, and
/// neither thread allocates per frame (each thread's count is in the sum; each thread's
/// frames are checked apart, so a thread that carried nothing cannot pass for one that
/// allocates nothing).
#[test]
fn the_plane_threads_allocate_nothing_per_frame() {
    plane_allocates_nothing_per_frame(2);
}

fn plane_allocates_nothing_per_frame(shards: u32) {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start_sharded("active", 2, 30_000, shards);
    bed.wait_phase("active", Duration::from_secs(10));
    let (idle, busy, frames) = flood_windows(&mut bed, |s| {
        let allocs = s["plane"]["stats"]["forwarding_allocs"]
            .as_u64()
            .unwrap_or_else(|| panic!("the plane's stats carry forwarding_allocs: {s:#}"));
        (allocs, plane_counter(s, "plane.frames.in"))
    });
    let s = bed.status();
    let per_shard = &s["plane"]["stats"]["shards"];
    eprintln!(
        "plane ({shards} thread(s)): {idle} allocations idle, {busy} over {frames} frames; \
         per shard {per_shard}"
    );
    assert!(
        frames >= 10_000,
        "the flood crossed the plane: {frames} frames"
    );
    for k in 0..shards as usize {
        let n = per_shard[k]["frames_in"].as_u64().unwrap_or(0);
        assert!(n >= 1000, "shard {k}'s thread took {n} frames: {per_shard}");
    }
    assert!(
        busy <= idle + frames / 1000,
        "the plane allocates per frame: {busy} allocations over {frames} frames, \
         {idle} in an idle window of the same length"
    );
    bed.stop_and_check_clean();
}

/// The emulated DPU's fast-path limit holds in real time: with the plane held off and a 10
/// kpps fast path, a paced 64-byte flood of 32 flows at three times the limit gets at most 10
/// kpps (plus what the fast path's input queue absorbs at the window's edges) through the
/// hardware path, and the excess is dropped and counted as `dpu.hw.overload`. Read over two
/// seconds once the flows are on the fast path. The limit is low so that even a starved debug
/// build on a shared CI machine offers well above it.
#[test]
fn taps_without_virtio_net_headers_forward_in_place_too() {
    if !spillway_testkit::prerequisites(&["ip", "iperf3", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // `vnet_hdr = false`: the TAPs carry bare frames (no offloads), so the ring reads each
    // frame with no metadata in front and writes it back with none.
    let mut bed = Bed::configure(2000, "", "", 30_000);
    let text = std::fs::read_to_string(&bed.config).unwrap();
    let text = text.replacen("[testbed]\n", "[testbed]\nvnet_hdr = false\n", 1);
    assert!(text.contains("vnet_hdr = false"), "{text}");
    std::fs::write(&bed.config, text).unwrap();
    bed.spawn("released");
    bed.iperf3_server();
    let v = iperf3_json(&bed, &["-t", "2"]);
    let got = v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
    let s = bed.status();
    eprintln!(
        "TCP without virtio-net headers: {got} bytes in 2 s; writes in place {} of {}",
        counter(&s, "rt.uring.writes_in_place"),
        counter(&s, "rt.uring.writes")
    );
    assert!(got > 1e6, "TCP without virtio-net headers: {got} bytes");
    assert!(counter(&s, "rt.uring.writes_in_place") > 1000, "{s:#}");
    assert_eq!(counter(&s, "rt.drop.vnet_hdr"), 0, "{s:#}");
    assert_eq!(counter(&s, "rt.uring.write_errors"), 0, "{s:#}");
    bed.stop_and_check_clean();
}

#[test]
fn the_fast_path_admits_no_more_than_its_limit() {
    fast_path_admits_no_more_than_its_limit(1);
}

/// The limit is the DPU's, not a thread's: two forwarding threads share the 10 kpps fast path
/// (not 10 kpps each), and the flows of the flood spread over both shards.
///
/// The kernel picks a flow's TAP queue (so its thread) by its own hash, the fabric its shard by
/// another; with ephemeral source ports, all of 8 flows landing on their own shard's queue
/// happened (1 in 256), so the flood has 32 flows: 1 in 2^32.
#[test]
fn two_forwarding_threads_share_the_fast_path_limit() {
    fast_path_admits_no_more_than_its_limit(2);
}

fn fast_path_admits_no_more_than_its_limit(shards: u32) {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start_sharded("released", 2000, 10_000, shards);
    bed.udp_sink();
    std::thread::sleep(Duration::from_millis(300));
    let flood = bed.udp_flood(32, 30_000, 4);
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    let s0 = bed.status();
    std::thread::sleep(Duration::from_secs(2));
    let s1 = bed.status();
    let secs = t0.elapsed().as_secs_f64();
    let sent = common::finish(flood, "traffic gen");
    let rate = |key: &str| (counter(&s1, key) - counter(&s0, key)) as f64 / secs;
    let dropped = |s: &serde_json::Value| s["drops"]["dpu.hw.overload"].as_u64().unwrap_or(0);
    let offered = rate("dpu.rx.packets");
    let hw = rate("dpu.hw.packets");
    let overload = (dropped(&s1) - dropped(&s0)) as f64 / secs;
    eprintln!(
        "{shards} thread(s): offered {offered:.0} pps, fast path {hw:.0} pps, overload drops \
         {overload:.0} pps, handed between threads {:.0} pps; gen: {sent}",
        rate("rt.handoff.frames")
    );
    assert!(
        offered > 12_000.0,
        "the flood exceeds the 10 kpps fast path by a fifth: {offered:.0} pps offered"
    );
    // The queue may drain a burst above the rate at the window's edges: 5% slack.
    assert!(
        hw <= 10_000.0 * 1.05,
        "fast path {hw:.0} pps > 10 kpps: {s1:#}"
    );
    assert!(
        hw >= 10_000.0 * 0.8,
        "the fast path carried the flood: {hw:.0} pps"
    );
    assert!(
        overload >= (offered - hw) * 0.8,
        "the excess is counted as dpu.hw.overload: {overload:.0} of {:.0} pps",
        offered - hw
    );
    assert_eq!(s1["phase"], "idle", "the plane stayed off");
    if shards > 1 {
        assert!(
            rate("rt.handoff.frames") > 0.0,
            "some of the flood arrived on the other shard's thread: {s1:#}"
        );
    }
    bed.stop_and_check_clean();
}

/// `ctl reload` reaches every forwarding thread's pipeline: after a reload that denies UDP to
/// port 9001, a flood of 32 new flows to that port (spread over both shards by their hash) is
/// dropped by the vSwitch whichever thread's connection it is; with the policy on thread 0
/// only, about half would be forwarded.
#[test]
fn two_forwarding_threads_take_a_reloaded_policy() {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start_sharded("released", 2000, 30_000, 2);
    let sink = [
        "traffic",
        "sink",
        "--bind",
        "10.66.0.2:9001",
        "--idle",
        "30",
    ];
    bed.server("b", BIN, &sink);
    let text = std::fs::read_to_string(&bed.config).unwrap();
    let deny = "[[policy.security_group.rule]]\ndirection = \"ingress\"\npriority = 0\n\
                action = \"deny\"\nprotocol = \"udp\"\nremote = \"10.66.0.0/24\"\nports = 9001\n";
    let text = text.replacen("[[vm]]\n", &format!("{deny}[[vm]]\n"), 1);
    std::fs::write(&bed.config, text).unwrap();
    let r = bed.ctl(&["reload"]);
    assert!(r["epoch"].as_u64().is_some(), "{r:#}");
    let s0 = bed.status();
    let flood = bed
        .exec("a", BIN)
        .args(["traffic", "gen", "--dst", "10.66.0.2:9001", "--flows", "32"])
        .args(["--rate", "5000", "--duration", "2", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sent = common::finish(flood, "traffic gen");
    std::thread::sleep(Duration::from_millis(300));
    let s1 = bed.status();
    let delta = |key: &str| counter(&s1, key) - counter(&s0, key);
    let sum = |s: &serde_json::Value| -> u64 {
        s["vswitch_drops"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum())
    };
    let (rx, tx, denied) = (
        delta("rt.rx.frames"),
        delta("rt.tx.frames"),
        sum(&s1) - sum(&s0),
    );
    eprintln!(
        "after reload: {rx} frames in, {tx} out, {denied} dropped by the vSwitch, {} handed \
         between threads; gen: {sent}",
        delta("rt.handoff.frames")
    );
    assert!(rx >= 5_000, "the flood reached the DPU process: {rx}");
    assert!(
        delta("rt.handoff.frames") > 0,
        "some flows are the other thread's: {s1:#}"
    );
    assert!(
        denied >= rx * 95 / 100 && tx <= rx / 20,
        "every thread denies the new flows: {rx} in, {tx} out, {denied} denied: {s1:#}"
    );
    bed.stop_and_check_clean();
}

#[test]
fn established_connections_survive_activation_and_release() {
    connections_survive_activation_and_release(1);
}

/// The same with two forwarding threads: the control thread's bulk sync, hand-over and
/// release reach both shards, and the plane's messages reach the shard of their connection.
#[test]
fn two_forwarding_threads_keep_connections_across_activation_and_release() {
    connections_survive_activation_and_release(2);
}

fn connections_survive_activation_and_release(shards: u32) {
    if !spillway_testkit::prerequisites(&["ip", "redis-server", "python3", "iperf3", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Two hardware entries: the first connection takes them, so the long-lived ones live on
    // the slow path, and activation hands them to the plane (hardware flows stay on the DPU).
    let mut bed = Bed::start_sharded("released", 2, 30_000, shards);
    bed.redis();
    bed.iperf3_server();
    let long = LongLived::start(&bed, 9);
    std::thread::sleep(Duration::from_secs(2));
    bed.ctl(&["activate"]);
    bed.wait_phase("active", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(1500));
    let flows = bed.ctl(&["flows", "--owner", "spill"]);
    let on_plane = flows["flows"].as_array().unwrap().len();
    let during = bed.status();
    bed.ctl(&["release"]);
    bed.wait_phase("idle", Duration::from_secs(10));
    let (pongs, stalled) = long.finish();
    let s = bed.status();
    eprintln!(
        "{pongs} PONGs, {on_plane} connections on the plane while active, activations {}",
        s["activations"]
    );
    assert!(
        on_plane >= 1,
        "activation handed established connections to the plane"
    );
    // The plane answered the drain (every steered frame had reached it: the drain fence),
    // rather than the DPU giving up after `dpu.drain_timeout`.
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("plane drained"), "{reason}");
    assert!(pongs > 100, "{pongs}");
    assert!(
        stalled.is_empty(),
        "iperf3 intervals without data at {stalled:?}"
    );
    assert!(
        s["counters"]["rt.snapshot.adopted"].as_u64().unwrap() >= 1,
        "{s:#}"
    );
    // What the plane handed back was checked at its `Released`, bucket by bucket, on every
    // shard (ADR 0012), and nothing differed.
    let buckets = u64::from(
        spillway_fabric::params::FabricParams::default()
            .dpu
            .redirect_buckets,
    );
    let compared = |s: &serde_json::Value| s["counters"]["dpu.digest.buckets"].as_u64().unwrap();
    assert!(compared(&s) >= compared(&during) + buckets, "{s:#}");
    assert_eq!(s["counters"]["dpu.digest.mismatch"], 0, "{s:#}");
    if shards > 1 {
        // Every frame and record of the plane came on its connection's shard's lane.
        assert_eq!(s["counters"]["rt.lane.misrouted"], 0, "{s:#}");
        // The plane runs a thread per shard, and each shard's thread served the frames of
        // its connections.
        let plane = &during["plane"]["stats"];
        assert_eq!(plane["threads"], shards, "{plane:#}");
        eprintln!("plane shards while active: {}", plane["shards"]);
        let buckets = spillway_fabric::params::FabricParams::default()
            .dpu
            .redirect_buckets;
        for row in flows["flows"].as_array().unwrap() {
            let conn = spillway_fabric::types::ConnId(row["conn"].as_u64().unwrap());
            let k = spillway_fabric::dpu::shard_of(conn, buckets, shards as usize);
            assert!(
                plane["shards"][k]["frames_in"].as_u64().unwrap() > 0,
                "shard {k} holds {row} but its thread took no frame: {plane:#}"
            );
        }
    }
    bed.stop_and_check_clean();
}

#[test]
fn killing_the_plane_fails_open_without_breaking_connections_and_the_fabric_recovers() {
    plane_kill_fails_open_and_recovers(1);
}

/// The same with two forwarding threads: the fail-open promotes both shards' mirrors.
#[test]
fn two_forwarding_threads_fail_open_when_the_plane_is_killed() {
    plane_kill_fails_open_and_recovers(2);
}

fn plane_kill_fails_open_and_recovers(shards: u32) {
    if !spillway_testkit::prerequisites(&["ip", "redis-server", "python3", "iperf3", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start_sharded("active", 2, 30_000, shards);
    bed.wait_phase("active", Duration::from_secs(10));
    bed.redis();
    bed.iperf3_server();
    let long = LongLived::start(&bed, 8);
    std::thread::sleep(Duration::from_secs(2));
    let before = bed.status();
    let pid = before["plane"]["pid"].as_u64().expect("a plane runs");
    // SAFETY: kill(2) with a pid read from the daemon; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    // The hold keeps asking for a plane: a new one comes up and activates again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = bed.status();
        let starts = s["counters"]["rt.plane.starts"].as_u64().unwrap();
        if starts >= 2 && s["phase"] == "active" && s["plane"]["up"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery: {s:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (pongs, stalled) = long.finish();
    let s = bed.status();
    let events: Vec<&str> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect();
    eprintln!("{pongs} PONGs across the kill; events {events:?}");
    assert!(events.contains(&"fail_open"), "{events:?}");
    assert!(s["counters"]["dpu.failopen"].as_u64().unwrap() >= 1);
    assert!(pongs > 100);
    assert!(
        stalled.is_empty(),
        "iperf3 intervals without data at {stalled:?}"
    );
    bed.stop_and_check_clean();
}

#[test]
fn a_crashed_run_is_cleaned_up_by_the_next_start() {
    if !spillway_testkit::prerequisites(&["ip", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start("active", 2000);
    bed.wait_phase("active", Duration::from_secs(10));
    let s = bed.status();
    let plane_pid = s["plane"]["pid"].as_u64().expect("a plane runs");
    // Crash the DPU process: nothing of its own cleanup runs.
    let mut d = bed.daemon.take().unwrap();
    d.kill().unwrap();
    d.wait().unwrap();
    let ns = String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        ns.contains(&bed.ns("a")),
        "the crash left its namespaces: {ns}"
    );
    let ledger = bed.dir.path().join(format!("{}.ledger", bed.name));
    assert!(ledger.exists(), "and its ledger");
    // The plane sees its control socket close and exits by itself.
    let deadline = Instant::now() + Duration::from_secs(5);
    // (Orphaned, it may linger as a zombie until init reaps it: that counts as exited.)
    while process_alive(plane_pid) {
        assert!(
            Instant::now() < deadline,
            "the orphaned plane {plane_pid} did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The next start of the same testbed removes the leftovers and comes up.
    bed.spawn("auto");
    assert!(bed.status()["phase"].is_string());
    bed.stop_and_check_clean();
}

/// The JSON report a `vm-endpoint` prints when it stops.
fn endpoint_report(c: Child, what: &str) -> serde_json::Value {
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{what}: {e}: {}", stdout(&o)))
}

fn counter(s: &serde_json::Value, key: &str) -> u64 {
    s["counters"][key].as_u64().unwrap_or(0)
}

/// A counter of the plane's process, as its last statistics (every 500 ms) in `ctl status` say.
fn plane_counter(s: &serde_json::Value, key: &str) -> u64 {
    s["plane"]["stats"]["counters"][key].as_u64().unwrap_or(0)
}

#[test]
fn iperf3_and_wrk_run_over_shared_memory_ports_with_vatc_on_and_off() {
    if !spillway_testkit::prerequisites(&["ip", "iperf3", "nginx", "wrk", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Both VMs on shared-memory ports bridged to TAPs in their namespaces; the plane is held
    // active, so new connections are the plane's, and it delivers into VM memory (vATC).
    let mut bed = Bed::start_with("active", 2000, "backend = \"shm\"", "vatc = true");
    bed.wait_phase("active", Duration::from_secs(10));
    let s = bed.status();
    let ports = s["vm_ports"].as_array().unwrap();
    assert!(
        ports.len() == 2 && ports.iter().all(|p| p["attached"] == true),
        "{s:#}"
    );
    bed.iperf3_server();
    let v = iperf3_json(&bed, &["-t", "3"]);
    let gbps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
        / 1e9;
    assert!(gbps > 0.05, "TCP over shared-memory ports: {gbps} Gbit/s");
    let s = bed.wait_plane_counter("plane.vatc.delivered", 1000, Duration::from_secs(5));
    let via_dpu_before = counter(&s, "rt.from_plane.frames");
    // nginx + wrk with the vATC path switched off at run time: the plane's packets go back
    // through the DPU now.
    bed.nginx();
    let off = bed.ctl(&["vatc", "off"]);
    assert_eq!(off["vatc"], false, "{off:#}");
    let (rps, errors) = wrk(&bed, true, 8, 3);
    assert!(rps > 50.0, "wrk over shared-memory ports: {rps} req/s");
    assert!(errors.is_empty(), "wrk errors: {errors}");
    let s = bed.status();
    assert!(
        counter(&s, "rt.from_plane.frames") > via_dpu_before + 1000,
        "without vATC the plane's packets come back through the DPU: {s:#}"
    );
    // And on again: new connections are delivered by the plane itself.
    let delivered = plane_counter(&s, "plane.vatc.delivered");
    bed.ctl(&["vatc", "on"]);
    let (rps, errors) = wrk(&bed, false, 4, 2);
    assert!(rps > 50.0 && errors.is_empty(), "{rps} req/s, {errors}");
    bed.wait_plane_counter(
        "plane.vatc.delivered",
        delivered + 500,
        Duration::from_secs(5),
    );
    eprintln!("shared-memory ports: TCP {gbps:.2} Gbit/s, wrk {rps:.0} req/s (debug build)");
    bed.stop_and_check_clean();
}

/// Shared-memory ports in front of two forwarding threads: each port's receive queue has one
/// producer, thread 0, which thread 1 hands the frames of its connections for the VMs
/// (`rt.handoff.to_port`); the plane, active, delivers into the VMs' memory from both of its
/// threads under one vATC.
#[test]
fn two_forwarding_threads_serve_shared_memory_ports() {
    if !spillway_testkit::prerequisites(&["ip", "iperf3", "nginx", "wrk", "ss"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start_sharded_vms(
        "active",
        (2000, 30_000),
        2,
        "backend = \"shm\"",
        "vatc = true",
    );
    bed.wait_phase("active", Duration::from_secs(10));
    bed.iperf3_server();
    // Four parallel streams: connections on both shards.
    let v = iperf3_json(&bed, &["-t", "2", "-P", "4"]);
    let gbps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
        / 1e9;
    assert!(gbps > 0.05, "TCP over shared-memory ports: {gbps} Gbit/s");
    bed.nginx();
    let (rps, errors) = wrk(&bed, false, 8, 2);
    assert!(rps > 50.0 && errors.is_empty(), "{rps} req/s, {errors}");
    let s = bed.wait_plane_counter("plane.vatc.delivered", 1000, Duration::from_secs(5));
    let per_thread = s["conns_per_thread"].as_array().expect("conns_per_thread");
    assert_eq!(per_thread.len(), 2, "{s:#}");
    assert!(counter(&s, "rt.handoff.to_port") > 0, "{s:#}");
    assert_eq!(counter(&s, "rt.lane.misrouted"), 0, "{s:#}");
    eprintln!(
        "shared-memory ports on two threads: TCP {gbps:.2} Gbit/s, wrk {rps:.0} req/s, {} frames \
         handed to thread 0 for the VMs ({} dropped for a full hand-off)",
        counter(&s, "rt.handoff.to_port"),
        counter(&s, "rt.handoff.full")
    );
    bed.stop_and_check_clean();
}

#[test]
fn vatc_delivers_into_the_plane_queue_saves_two_crossings_and_survives_a_new_vm_memory() {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Bed::start_with(
        "active",
        2000,
        "backend = \"shm\"\nendpoint = \"external\"",
        "vatc = true",
    );
    bed.wait_phase("active", Duration::from_secs(10));
    let gen_sink = |bed: &Bed| {
        let sink = bed.endpoint("b", &["--mode", "sink", "--duration", "4.7"]);
        std::thread::sleep(Duration::from_millis(1500));
        let before = bed.status();
        let g = bed.endpoint(
            "a",
            &[
                "--mode",
                "gen",
                "--dst",
                "b",
                "--pps",
                "5000",
                "--duration",
                "2",
            ],
        );
        let g = endpoint_report(g, "gen");
        let s = endpoint_report(sink, "sink");
        let after = bed.status();
        // Crossings per packet the DPU took in (as bench/vatc.sh counts them), so a packet
        // lost at the sink does not inflate the figure.
        let crossings = counter(&after, "pcie.crossings") - counter(&before, "pcie.crossings");
        let taken = counter(&after, "dpu.rx.packets") - counter(&before, "dpu.rx.packets");
        (g, s, crossings as f64 / taken.max(1) as f64)
    };
    // With vATC: the plane copies into VM b's second receive queue; the DPU charges only the
    // crossing that brought each packet to the host.
    let (g, s, per_packet) = gen_sink(&bed);
    let sent = g["tx_frames"].as_u64().unwrap();
    let plane = s["rx_plane"].as_u64().unwrap();
    let got = plane + s["rx_dpu"].as_u64().unwrap();
    let why = || {
        let st = bed.status();
        format!(
            "gen {g:#} sink {s:#} plane {:#} dpu {:#}",
            st["plane"]["stats"]["counters"], st["counters"]
        )
    };
    // At least 90% arrive: in 2 of about 10 runs on this shared 2-core machine the DPU process
    // and the sink (not pinned) stalled for about 200 ms together, the plane (pinned) did not,
    // and the sink's queues overflowed; the cause was not found.
    assert!(sent > 5000 && got * 10 >= sent * 9, "{}", why());
    assert!(
        plane * 10 >= got * 9,
        "most packets by the plane's queue: {}",
        why()
    );
    assert!(
        per_packet < 1.3,
        "with vATC {per_packet:.2} crossings per packet"
    );
    // A new memory for VM b (its endpoint restarted): the old one was invalidated, the plane
    // maps the new one and translates again.
    let st = bed.status();
    assert!(counter(&st, "rt.atc.invalidations") >= 1, "{st:#}");
    // Without vATC: back through the DPU, which delivers into the first receive queue.
    bed.ctl(&["vatc", "off"]);
    let (_, s, per_packet_off) = gen_sink(&bed);
    assert_eq!(s["rx_plane"].as_u64(), Some(0), "{s:#}");
    assert!(
        (2.7..3.3).contains(&per_packet_off),
        "without vATC {per_packet_off:.2} crossings per packet"
    );
    // On again with a third VM b memory: delivered by the plane again.
    bed.ctl(&["vatc", "on"]);
    let (_, s, _) = gen_sink(&bed);
    assert!(s["rx_plane"].as_u64().unwrap() > 1000, "{s:#}");
    let st = bed.status();
    assert!(
        plane_counter(&st, "atc.fill") >= 2,
        "each new memory is translated afresh: {st:#}"
    );
    eprintln!(
        "crossings per packet: {per_packet:.2} with vATC, {per_packet_off:.2} without (debug build)"
    );
    bed.stop_and_check_clean();
}

#[test]
fn the_spill_plane_runs_unprivileged_under_seccomp_and_still_carries_traffic() {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Bed::start_with(
        "active",
        2000,
        "backend = \"shm\"\nendpoint = \"external\"",
        "vatc = true",
    );
    bed.wait_phase("active", Duration::from_secs(10));
    let pid = bed.status()["plane"]["pid"].as_u64().expect("a plane runs");
    // The plane drops its privileges right after its set-up, which "active" follows closely.
    let field = |status: &str, name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        if field(&status, "Seccomp") == "2" || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (name, want) in [
        ("Uid", "65534 65534 65534 65534"),
        ("Gid", "65534 65534 65534 65534"),
        ("Groups", ""),
        ("CapInh", "0000000000000000"),
        ("CapPrm", "0000000000000000"),
        ("CapEff", "0000000000000000"),
        ("CapBnd", "0000000000000000"),
        ("CapAmb", "0000000000000000"),
        ("NoNewPrivs", "1"),
        ("Seccomp", "2"),
    ] {
        assert_eq!(field(&status, name), want, "{name} of the plane: {status}");
    }
    // Traffic still crosses the plane, which maps each VM's memory it receives after the drop
    // (the endpoints attach now) and delivers into VM b's plane queue.
    let sink = bed.endpoint("b", &["--mode", "sink", "--duration", "3.5"]);
    std::thread::sleep(Duration::from_millis(1000));
    let g = bed.endpoint(
        "a",
        &[
            "--mode",
            "gen",
            "--dst",
            "b",
            "--pps",
            "2000",
            "--duration",
            "1.5",
        ],
    );
    let g = endpoint_report(g, "gen");
    let s = endpoint_report(sink, "sink");
    let st = bed.status();
    let sent = g["tx_frames"].as_u64().unwrap();
    let plane = s["rx_plane"].as_u64().unwrap();
    assert!(
        sent > 1000 && plane * 2 >= sent,
        "gen {g:#} sink {s:#} plane {:#}",
        st["plane"]["stats"]["counters"]
    );
    // The same plane did it: the filter killed nothing, so nothing was restarted.
    assert_eq!(st["plane"]["pid"].as_u64(), Some(pid), "{st:#}");
    assert_eq!(counter(&st, "rt.plane.starts"), 1, "{st:#}");
    bed.stop_and_check_clean();
}

/// Warm standby: `[fabric.host] warm_standby = true` on a bed held active.
const WARM: &str = "warm_standby = true";

/// Waits until an active plane other than `not` (a pid; 0 for any) is up and a warm plane is
/// synced beside it; returns the status.
fn wait_warm_ready(bed: &Bed, not: u64, within: Duration) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let s = bed.status();
        if s["phase"] == "active"
            && s["plane"]["up"] == true
            && s["plane"]["pid"] != not
            && s["warm"] == "ready"
        {
            return s;
        }
        assert!(Instant::now() < deadline, "no warm plane ready: {s:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The events of a status, oldest first, as (name, reason).
fn events(s: &serde_json::Value) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = s["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_string(),
                e["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    v.reverse();
    v
}

/// A bed held active with a warm plane ready, redis and iperf3 serving, and [`LongLived`]
/// connections running for 8 s, 2 s in, on `shards` forwarding threads; `None` if the test
/// skips. The guard serialises the tests.
fn warm_bed_under_load(
    shards: u32,
) -> Option<(std::sync::MutexGuard<'static, ()>, Bed, LongLived)> {
    if !spillway_testkit::prerequisites(&["ip", "redis-server", "python3", "iperf3", "ss"]) {
        return None;
    }
    let g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bed = Bed::start_sharded_with("active", 2, 30_000, shards, WARM);
    bed.redis();
    bed.iperf3_server();
    wait_warm_ready(&bed, 0, Duration::from_secs(15));
    let long = LongLived::start(&bed, 8);
    std::thread::sleep(Duration::from_secs(2));
    Some((g, bed, long))
}

/// The warm plane takes over from a plane killed with SIGKILL: no fail-open, every connection
/// continues (the redis connection answers every PING, iperf3 never stalls a second), and a new
/// warm plane is synced in the freed slot.
#[test]
fn a_warm_plane_takes_over_from_a_killed_plane_and_no_connection_breaks() {
    warm_plane_takes_over_from_a_killed_plane(1);
}

/// The same with two forwarding threads: each serves its lane of both planes' vNIC sets, and
/// the flip moves every thread's shard to the warm plane's lanes.
#[test]
fn two_forwarding_threads_fail_over_to_a_warm_plane_when_the_plane_is_killed() {
    warm_plane_takes_over_from_a_killed_plane(2);
}

fn warm_plane_takes_over_from_a_killed_plane(shards: u32) {
    let Some((_g, bed, long)) = warm_bed_under_load(shards) else {
        return;
    };
    let probe = UdpProbe::on_every_shard(&bed, shards, 4);
    let active = bed.status();
    let pid = active["plane"]["pid"].as_u64().expect("an active plane");
    let slot = active["active_slot"].as_u64().unwrap();
    // SAFETY: kill(2) with a pid read from the daemon; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let after = wait_warm_ready(&bed, pid, Duration::from_secs(15));
    let (pongs, stalled, gap_ms) = long.finish_with_gap();
    let s = bed.status();
    let ev = events(&s);
    eprintln!(
        "{pongs} PONGs, longest gap {gap_ms} ms; slot {slot} -> {}; events {ev:?}",
        after["active_slot"]
    );
    assert_ne!(after["active_slot"].as_u64().unwrap(), slot, "{after:#}");
    assert_ne!(after["plane"]["pid"], pid, "{after:#}");
    assert!(ev.iter().any(|(e, _)| e == "fail_over"), "{ev:?}");
    assert!(!ev.iter().any(|(e, _)| e == "fail_open"), "{ev:?}");
    assert_eq!(s["counters"]["dpu.failopen"], 0, "{s:#}");
    assert!(
        s["counters"]["dpu.sync.relay"].as_u64().unwrap() >= 1,
        "{s:#}"
    );
    assert!(pongs > 200, "{pongs}");
    assert!(
        stalled.is_empty(),
        "iperf3 intervals without data at {stalled:?}"
    );
    // The warm plane's sync was checked against the DPU's own digests, bucket by bucket, and
    // so was the new active plane after the flip, under load: nothing differed (a change on
    // its way while the digests travelled leaves its bucket out, it is not a difference).
    assert!(
        s["counters"]["dpu.digest.buckets"].as_u64().unwrap() > 0,
        "{s:#}"
    );
    assert_eq!(s["counters"]["dpu.digest.mismatch"], 0, "{s:#}");
    probe.check_nothing_lost(&s);
    bed.stop_and_check_clean();
}

/// A plane stopped with SIGSTOP for 2 s misses its heartbeats: the DPU fences it (closes its
/// vNIC set, then kills it) and flips to the warm plane; no connection breaks, and the stopped
/// process never comes back.
#[test]
fn a_stalled_plane_is_fenced_and_the_warm_plane_takes_over() {
    stalled_plane_is_fenced(1);
}

/// The same with two forwarding threads: what each thread steered to the stopped plane is
/// taken back from its own lane once the process is reaped.
#[test]
fn two_forwarding_threads_fence_a_stalled_plane_and_fail_over() {
    stalled_plane_is_fenced(2);
}

fn stalled_plane_is_fenced(shards: u32) {
    let Some((_g, bed, long)) = warm_bed_under_load(shards) else {
        return;
    };
    let probe = UdpProbe::on_every_shard(&bed, shards, 4);
    let pid = bed.status()["plane"]["pid"]
        .as_u64()
        .expect("an active plane");
    // SAFETY: kill(2) with a pid read from the daemon; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
    std::thread::sleep(Duration::from_secs(2));
    // Resumed (if it still exists): whatever it sends now must not reach the DPU.
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    let after = wait_warm_ready(&bed, pid, Duration::from_secs(15));
    let (pongs, stalled, gap_ms) = long.finish_with_gap();
    let s = bed.status();
    let ev = events(&s);
    eprintln!("{pongs} PONGs, longest gap {gap_ms} ms; events {ev:?}");
    assert_ne!(after["plane"]["pid"], pid, "{after:#}");
    assert!(
        !process_alive(pid),
        "the stalled plane {pid} was not killed"
    );
    let over = ev
        .iter()
        .find(|(e, _)| e == "fail_over")
        .unwrap_or_else(|| panic!("no failover: {ev:?}"));
    assert!(over.1.contains("heartbeat"), "{over:?}");
    assert!(!ev.iter().any(|(e, _)| e == "fail_open"), "{ev:?}");
    // It was killed rather than asked to exit, and what was steered to it while it was
    // stopped was taken back from its ring, to be served by the plane that took over.
    assert!(
        s["counters"]["rt.plane.reclaimed"].as_u64().unwrap() > 0,
        "{s:#}"
    );
    assert!(pongs > 200, "{pongs}");
    assert!(
        stalled.is_empty(),
        "iperf3 intervals without data at {stalled:?}"
    );
    probe.check_nothing_lost(&s);
    bed.stop_and_check_clean();
}

/// `spillway ctl upgrade --binary` under load (redis PINGs, an iperf3 transfer, wrk over
/// keep-alive connections): the new plane runs the new binary, takes over, the old one retires,
/// and no connection breaks. A binary that others could write is refused.
#[test]
fn an_online_upgrade_under_load_loses_no_connection() {
    online_upgrade_under_load(1);
}

/// The same with two forwarding threads.
#[test]
fn two_forwarding_threads_upgrade_online_under_load() {
    online_upgrade_under_load(2);
}

fn online_upgrade_under_load(shards: u32) {
    if !spillway_testkit::prerequisites(&[
        "ip",
        "redis-server",
        "python3",
        "iperf3",
        "ss",
        "nginx",
        "wrk",
    ]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // No warm standby: the upgrade starts its own warm plane.
    let mut bed = Bed::start_sharded("active", 2, 30_000, shards);
    bed.wait_phase("active", Duration::from_secs(10));
    bed.redis();
    bed.iperf3_server();
    bed.nginx();
    // The new binary: a copy, in this test's own directory.
    let new_bin = bed.binary_copy("spillway-next", 0o755);
    // One others could write is refused, naming the file.
    let unsafe_bin = bed.binary_copy("spillway-open", 0o777);
    let refused = Command::new(BIN)
        .args(["ctl", "--config"])
        .arg(&bed.config)
        .args(["upgrade", "--binary"])
        .arg(&unsafe_bin)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("spillway-open") && err.contains("not writable"),
        "{err}"
    );
    let old_pid = bed.status()["plane"]["pid"]
        .as_u64()
        .expect("an active plane");
    let long = LongLived::start(&bed, 9);
    let wrk = {
        let mut c = bed.exec("a", "wrk");
        c.args(["-t1", "-c8", "-d8", "http://10.66.0.2:8080/"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let probe = UdpProbe::on_every_shard(&bed, shards, 4);
    std::thread::sleep(Duration::from_secs(2));
    let asked = bed.ctl(&["upgrade", "--binary", new_bin.to_str().unwrap()]);
    eprintln!("upgrade: {asked}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let done = loop {
        let s = bed.status();
        if s["upgrade"] == "none" && s["plane"]["pid"] != old_pid && s["plane"]["up"] == true {
            break s;
        }
        assert!(Instant::now() < deadline, "upgrade not done: {s:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let new_pid = done["plane"]["pid"].as_u64().unwrap();
    let exe = std::fs::read_link(format!("/proc/{new_pid}/exe")).unwrap();
    assert_eq!(exe, std::fs::canonicalize(&new_bin).unwrap());
    let wrk_out = common::finish(wrk, "wrk");
    let (pongs, stalled, gap_ms) = long.finish_with_gap();
    let s = bed.status();
    let ev = events(&s);
    eprintln!("{pongs} PONGs, longest gap {gap_ms} ms; wrk: {wrk_out}; events {ev:?}");
    assert!(
        !process_alive(old_pid),
        "the old plane {old_pid} still runs"
    );
    assert!(
        !ev.iter().any(|(e, _)| e == "fail_open" || e == "fail_over"),
        "{ev:?}"
    );
    assert_eq!(s["counters"]["dpu.failopen"], 0, "{s:#}");
    assert!(!wrk_out.contains("Socket errors"), "{wrk_out}");
    assert!(pongs > 200, "{pongs}");
    assert!(
        stalled.is_empty(),
        "iperf3 intervals without data at {stalled:?}"
    );
    probe.check_nothing_lost(&s);
    bed.stop_and_check_clean();
}

/// With warm standby on, `ctl upgrade --binary` does not take the warm plane that runs the old
/// binary: it is replaced by one of the new binary, which then becomes the active plane.
#[test]
fn an_upgrade_to_another_binary_replaces_the_warm_plane_first() {
    if !spillway_testkit::prerequisites(&["ip"]) {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Bed::start_with("active", 2, "", WARM);
    let before = wait_warm_ready(&bed, 0, Duration::from_secs(15));
    let old_active = before["plane"]["pid"].as_u64().unwrap();
    let old_warm = before["planes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "warm")
        .and_then(|p| p["pid"].as_u64())
        .expect("a warm plane");
    let new_bin = bed.binary_copy("spillway-next", 0o755);
    bed.ctl(&["upgrade", "--binary", new_bin.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(15);
    let done = loop {
        let s = bed.status();
        let pid = s["plane"]["pid"].as_u64().unwrap_or(0);
        if s["upgrade"] == "none" && ![0, old_active, old_warm].contains(&pid) {
            break s;
        }
        assert!(Instant::now() < deadline, "upgrade not done: {s:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let pid = done["plane"]["pid"].as_u64().unwrap();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe, std::fs::canonicalize(&new_bin).unwrap());
    let ev = events(&done);
    assert!(
        !ev.iter().any(|(e, _)| e == "fail_open" || e == "fail_over"),
        "{ev:?}"
    );
    assert!(ev.iter().any(|(e, _)| e == "upgraded"), "{ev:?}");
    // A new warm plane follows, of the new binary too.
    let after = wait_warm_ready(&bed, old_active, Duration::from_secs(15));
    assert_eq!(
        after["plane_exe"],
        new_bin.canonicalize().unwrap().to_str().unwrap()
    );
    bed.stop_and_check_clean();
}
