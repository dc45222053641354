//! End to end: guests configured like unmodified VMs, with only an address and a default route
//! (no static neighbour entries, no on-link routes to peers), reach each other through
//! `spillway run`. VM `a` (10.69.0.1/24, fd00:69::1/64) and VM `b` (10.69.1.2/24,
//! fd00:69:1::2/64) are in different subnets of one tenant whose routers are 10.69.0.254 and
//! 10.69.1.254 (IPv6: the router's link-local address): each pings the other over IPv4 and IPv6
//! through its default gateway, which it resolves with ARP or neighbour discovery answered by
//! the vSwitch's neighbour responder, after IPv6 duplicate address detection has passed. The
//! test checks the pings, that each guest's neighbour table holds its gateway at the tenant
//! router's MAC and nothing permanent, and that the daemon leaves no namespace behind.
//!
//! Then the router's MTU handling with real stacks: `b`'s port delivers at most 1400 bytes while
//! both guests' links say 1500. An iperf3 TCP transfer from `a` to `b` completes, and `a`'s
//! kernel holds a path MTU of 1400 for `b` afterwards, learned from the vSwitch's
//! fragmentation-needed (its TSO super-frames were measured by their segments). iperf3 UDP with
//! 3,000-byte datagrams, which the guests fragment, arrives without loss both ways. With the
//! learned MTU flushed, 3,000-byte pings with DF clear from `a` draw fragmentation-needed for
//! their first 1500-byte fragment and get through from then on.
//!
//! Needs root and `ip`, `ping` and `iperf3`; under `CI=true` a missing one fails the test,
//! elsewhere it prints why it skips.

#[allow(dead_code)]
mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");
const ROUTER_MAC: &str = "02:00:00:00:01:01";
/// fe80:: + modified EUI-64 of the router MAC.
const ROUTER_LL: &str = "fe80::ff:fe00:101";

/// The daemon and its testbed; stopped (SIGINT) and checked when dropped.
struct Bed {
    name: String,
    dir: tempfile::TempDir,
    daemon: Option<Child>,
    /// Programs serving inside the namespaces; killed before the daemon stops.
    servers: Vec<Child>,
}

impl Bed {
    fn start() -> Bed {
        let name = format!("n{:x}", std::process::id() % 0xfffff);
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("testbed.toml");
        let text = format!(
            r#"
[testbed]
name = "{name}"
state_dir = "{state}"
[spill]
cpus = "1"
memory_max = "512M"
[policy.host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"
[[policy.tenant]]
id = 1
vni = 100
router_mac = "{ROUTER_MAC}"
subnets = ["10.69.0.0/24", "10.69.1.0/24", "fd00:69::/64", "fd00:69:1::/64"]
router_ips = ["10.69.0.254", "10.69.1.254"]
[[policy.port]]
id = 1
tenant = 1
mac = "02:00:00:00:00:0a"
ips = ["10.69.0.1", "fd00:69::1"]
security_groups = [1]
[[policy.port]]
id = 2
tenant = 1
mac = "02:00:00:00:00:0b"
ips = ["10.69.1.2", "fd00:69:1::2"]
security_groups = [1]
mtu = 1400
[[policy.security_group]]
id = 1
tenant = 1
[[policy.security_group.rule]]
direction = "ingress"
priority = 1
action = "allow"
protocol = "icmp"
remote = "10.69.0.0/16"
[[policy.security_group.rule]]
direction = "ingress"
priority = 2
action = "allow"
protocol = "icmpv6"
remote = "fd00:69::/32"
[[policy.security_group.rule]]
direction = "ingress"
priority = 3
action = "allow"
protocol = "tcp"
remote = "10.69.0.0/16"
ports = "5201-5202"
[[policy.security_group.rule]]
direction = "ingress"
priority = 3
action = "allow"
protocol = "udp"
remote = "10.69.0.0/16"
ports = "5201-5202"
[[vm]]
name = "a"
port = 1
[[vm]]
name = "b"
port = 2
mtu = 1500
"#,
            state = dir.path().display(),
        );
        std::fs::write(&config, text).expect("write testbed");
        let ready = dir.path().join("ready");
        let log = std::fs::File::create(dir.path().join("daemon.log")).expect("log file");
        let daemon = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&config)
            .arg("--ready-file")
            .arg(&ready)
            .args(["--hold", "released", "--log", "warn"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn spillway run");
        let mut bed = Bed {
            name,
            dir,
            daemon: Some(daemon),
            servers: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            if let Some(s) = bed
                .daemon
                .as_mut()
                .and_then(|d| d.try_wait().ok().flatten())
            {
                panic!("spillway run exited ({s}) before ready: {}", bed.log());
            }
            assert!(
                Instant::now() < deadline,
                "not ready in 30 s: {}",
                bed.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bed
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    fn ns(&self, vm: &str) -> String {
        format!("{}-{vm}", self.name)
    }

    fn ip(&self, vm: &str, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["-n", &self.ns(vm)])
            .args(args)
            .output()
            .expect("run ip");
        assert!(out.status.success(), "ip {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn ping(&self, vm: &str, to: &str) -> Output {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns(vm),
                "ping",
                "-c",
                "3",
                "-i",
                "0.2",
                "-W",
                "2",
            ])
            .arg(to)
            .output()
            .expect("run ping")
    }

    fn exec(&self, vm: &str, program: &str) -> Command {
        common::netns_exec(&self.ns(vm), program)
    }

    /// Starts iperf3 as a server on `port` in `vm` and waits until it listens.
    fn iperf3_server(&mut self, vm: &str, port: u16) {
        let child = self
            .exec(vm, "iperf3")
            .args(["-s", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn iperf3 -s");
        self.servers.push(child);
        common::wait_listening(&self.ns(vm), port);
    }

    /// Runs an iperf3 client in `vm` against `to:port`; returns its JSON report.
    fn iperf3(&self, vm: &str, to: &str, port: u16, args: &[&str]) -> serde_json::Value {
        let out = self
            .exec(vm, "iperf3")
            .args(["-c", to, "-p", &port.to_string(), "-J"])
            .args(args)
            .output()
            .expect("run iperf3");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "iperf3 {args:?} in {vm}: no JSON ({e}): {}{}\ndaemon: {}",
                String::from_utf8_lossy(&out.stdout),
                stderr(&out),
                self.log()
            )
        });
        assert!(
            v.get("error").is_none(),
            "iperf3 {args:?} in {vm}: {}\ndaemon: {}",
            v["error"],
            self.log()
        );
        v
    }

    /// SIGINT, wait, and check that the namespaces are gone.
    fn stop(&mut self) {
        self.stop_servers();
        let Some(mut d) = self.daemon.take() else {
            return;
        };
        // SAFETY: signalling our own unreaped child.
        unsafe {
            libc::kill(d.id() as i32, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while d.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = d.kill();
                let _ = d.wait();
                panic!("spillway run did not stop on SIGINT: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Bed {
    fn stop_servers(&mut self) {
        for mut s in self.servers.drain(..) {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.stop_servers();
        if let Some(mut d) = self.daemon.take() {
            // SAFETY: signalling our own unreaped child.
            unsafe {
                libc::kill(d.id() as i32, libc::SIGINT);
            }
            let _ = d.wait();
        }
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn netns_list() -> String {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn guests_with_only_an_address_and_a_default_route_resolve_and_ping() {
    if !spillway_testkit::prerequisites(&["ip", "ping", "iperf3", "ss"]) {
        return;
    }
    let mut bed = Bed::start();
    // What the guests were given: an address, its subnet, a default route. Nothing else.
    for (vm, gw) in [("a", "10.69.0.254"), ("b", "10.69.1.254")] {
        let routes = bed.ip(vm, &["-4", "route", "show"]);
        assert!(
            routes.contains(&format!("default via {gw} ")),
            "{vm}: {routes}"
        );
        assert_eq!(
            routes.lines().count(),
            2,
            "{vm}: default + connected only: {routes}"
        );
        let neigh = bed.ip(vm, &["-4", "neigh", "show"]);
        assert!(!neigh.contains("PERMANENT"), "{vm}: {neigh}");
    }
    // IPv6: duplicate address detection completes (the responder keeps silent about a guest's
    // own address) and the default route goes via the router's link-local address.
    for vm in ["a", "b"] {
        let routes = bed.ip(vm, &["-6", "route", "show", "default"]);
        assert!(
            routes.contains(&format!("default via {ROUTER_LL} ")),
            "{vm}: {routes}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let addrs = bed.ip(vm, &["-6", "addr", "show", "scope", "global"]);
            assert!(!addrs.contains("dadfailed"), "{vm}: DAD failed: {addrs}");
            if addrs.contains("inet6 fd00:69") && !addrs.contains("tentative") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{vm}: DAD did not finish: {addrs}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for (vm, to) in [
        ("a", "10.69.1.2"),
        ("b", "10.69.0.1"),
        ("a", "fd00:69:1::2"),
        ("b", "fd00:69::1"),
    ] {
        let out = bed.ping(vm, to);
        assert!(
            out.status.success(),
            "{vm} pings {to}: {}{}\ndaemon: {}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out),
            bed.log()
        );
    }
    // The gateways were resolved through the responder, to the tenant router's MAC; the IPv6
    // one is marked a router (the advertisement's R flag).
    for (vm, gw) in [("a", "10.69.0.254"), ("b", "10.69.1.254")] {
        let neigh = bed.ip(vm, &["-4", "neigh", "show", gw]);
        assert!(
            neigh.contains(&format!("lladdr {ROUTER_MAC}")),
            "{vm}: {neigh:?}"
        );
        let neigh = bed.ip(vm, &["-6", "neigh", "show", ROUTER_LL]);
        assert!(
            neigh.contains(&format!("lladdr {ROUTER_MAC} router")),
            "{vm}: {neigh:?}"
        );
        let neigh = bed.ip(vm, &["neigh", "show", "nud", "permanent"]);
        assert!(neigh.trim().is_empty(), "{vm}: {neigh}");
    }

    // Path MTU. Both guests' links are 1500 bytes; b's port delivers 1400.
    let link = bed.ip("b", &["-o", "link", "show", "eth0"]);
    assert!(link.contains("mtu 1500"), "b's own link: {link}");
    let route = bed.ip("a", &["-4", "route", "get", "10.69.1.2"]);
    assert!(
        !route.contains("mtu"),
        "a starts without a learned path MTU: {route}"
    );
    bed.iperf3_server("b", 5201);
    // One second of TCP: a's TSO super-frames are cut into 1500-byte packets, which the router
    // refuses with fragmentation-needed (1400); a lowers its MSS, retransmits and carries on.
    let v = bed.iperf3("a", "10.69.1.2", 5201, &["-t", "1"]);
    let got = v["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
    assert!(
        got >= 10e6,
        "TCP a -> b received {got} bytes in 1 s: {}",
        v["end"]
    );
    eprintln!(
        "TCP a -> b over a 1400-byte path: {got} bytes received in 1 s, {} retransmits",
        v["end"]["sum_sent"]["retransmits"]
    );
    let route = bed.ip("a", &["-4", "route", "get", "10.69.1.2"]);
    assert!(
        route.contains("mtu 1400"),
        "a learned b's path MTU from the router's fragmentation-needed: {route}"
    );
    // UDP datagrams larger than the links, fragmented by the senders. b -> a: every fragment
    // fits a's port.
    bed.iperf3_server("a", 5202);
    let udp = ["-u", "-l", "3000", "-b", "20M", "-t", "2"];
    let v = bed.iperf3("b", "10.69.0.1", 5202, &udp);
    let sum = &v["end"]["sum"];
    assert!(sum["packets"].as_u64().unwrap_or(0) > 1000, "b -> a: {sum}");
    assert_eq!(sum["lost_packets"].as_u64(), Some(0), "b -> a: {sum}");
    eprintln!("UDP 3000-byte datagrams b -> a: {sum}");
    // a -> b: a knows the path MTU now and fragments to 1400.
    let v = bed.iperf3("a", "10.69.1.2", 5201, &udp);
    let sum = &v["end"]["sum"];
    assert!(sum["packets"].as_u64().unwrap_or(0) > 1000, "a -> b: {sum}");
    assert_eq!(sum["lost_packets"].as_u64(), Some(0), "a -> b: {sum}");
    eprintln!("UDP 3000-byte datagrams a -> b: {sum}");
    // With the path MTU forgotten, 3,000-byte pings with DF clear: a's first 1500-byte
    // fragment is answered with fragmentation-needed, a fragments to 1400 from then on.
    Command::new("ip")
        .args(["-n", &bed.ns("a"), "route", "flush", "cache"])
        .status()
        .expect("ip route flush cache");
    let route = bed.ip("a", &["-4", "route", "get", "10.69.1.2"]);
    assert!(
        !route.contains("mtu"),
        "a's path MTU was forgotten: {route}"
    );
    let out = bed
        .exec("a", "ping")
        .args([
            "-M",
            "dont",
            "-s",
            "3000",
            "-c",
            "5",
            "-i",
            "0.2",
            "-W",
            "1",
            "10.69.1.2",
        ])
        .output()
        .expect("run ping");
    let text = String::from_utf8_lossy(&out.stdout);
    let received: u32 = text
        .split(", ")
        .find_map(|f| f.strip_suffix(" received")?.parse().ok())
        .unwrap_or_else(|| panic!("ping summary: {text}"));
    assert!(received >= 4, "at most the first ping is lost: {text}");
    eprintln!("3000-byte pings with DF clear, path MTU forgotten: {received} of 5 answered");
    let route = bed.ip("a", &["-4", "route", "get", "10.69.1.2"]);
    assert!(
        route.contains("mtu 1400"),
        "a relearned the path MTU: {route}"
    );
    bed.stop();
    let left = netns_list();
    for vm in ["a", "b"] {
        assert!(!left.contains(&bed.ns(vm)), "namespace left behind: {left}");
    }
}
