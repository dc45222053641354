//! End to end: a host with no idle core spills to a pool host's cores across the underlay.
//!
//! Two `spillway run` on one machine and a real etcd (started by the test). Each host has its
//! own network namespace on the underlay (`ha-*`, `hp-*`: a veth into the test's bridge, with
//! `.101` and `.102`), as a host's own stack has its port on the physical network. The two
//! tests deploy the hosts two ways ([`Layout`]): the DPU processes in the test's namespace with
//! their cluster links in the host namespaces (`cluster.netns`; etcd on loopback), or each DPU
//! process inside its host's namespace (etcd on the test's own address on the underlay). Host P
//! offers 2 pool cores and serves remote planes on `.102:7400`. Host A has 4 cores, 2 sold to
//! tenants and 2 reserved, so none to isolate, and a DPU fast path of 400 packets/s.
//!
//! VM `a` keeps one TCP connection to redis in VM `b` (a PING every 20 ms) and floods `b` with
//! pings. URSched sees the pressure, finds no core here and falls back; the cluster agent
//! reserves P's cores (with a token) and URSched places the plane there: A's DPU process starts
//! the relay, which connects to P's service from A's namespace; P checks the reservation and
//! token in etcd and starts the plane in its pool cgroup on A's testbed; the plane serves A's
//! overflow through the relay. The test prints the time from URSched's fallback (the trigger)
//! to the first redirected packet the plane served, on A's clock (its events).
//!
//! Then either P is killed (`SIGKILL` of its DPU process, its plane with it): A fails open and
//! the redis connection, whose state the plane had synced to A's DPU, carries on; or A's tenants
//! give two cores back (`ctl tenant-cores 0`): the remote plane is released, its connections
//! come home, and a plane on A's own cores takes the overflow.
//!
//! Needs root, `ip`, `ping`, `python3`, `redis-server` and `etcd`; under `CI=true` a missing
//! one fails the test, elsewhere it prints why it skips.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Killed, wait_for};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

/// Where the hosts' DPU processes run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// In the test's namespace, with etcd on loopback; each host's cluster links (the relay,
    /// the pool service) live in its namespace on the underlay (`cluster.netns`).
    Shared,
    /// Each inside its host's namespace (`testbed.netns`), with etcd on the test's own address
    /// on the underlay (`.250`, a veth into the bridge): a host is a namespace.
    HostNamespaces,
}

/// What both hosts' testbeds start with: the host `h` (`a` or `p`) in the cluster, with its
/// namespace `h<h>-<id>` its cluster links' ([`Layout::Shared`]) or its DPU process's.
fn header(name: &str, state: &Path, etcd: &str, h: char, id: &str, layout: Layout) -> String {
    let ns = format!("netns = \"h{h}-{id}\"\n");
    let (process_ns, links_ns) = match layout {
        Layout::Shared => (String::new(), ns),
        Layout::HostNamespaces => (ns, String::new()),
    };
    format!(
        r#"
[testbed]
name = "{name}"
state_dir = "{state}"
{process_ns}[spill]
cpus = "1"
memory_max = "512M"
[cluster]
host = "{h}-{id}"
etcd = ["{etcd}"]
lease_ttl_s = 5
{links_ns}"#,
        state = state.display(),
    )
}

/// Host A: two VMs, no isolatable core, a 400 pps fast path; with [`Layout::HostNamespaces`]
/// two forwarding threads (the link carries both lanes).
fn host_a(name: &str, state: &Path, etcd: &str, id: &str, layout: Layout) -> String {
    let shards = match layout {
        Layout::Shared => 1,
        Layout::HostNamespaces => 2,
    };
    let text = header(name, state, etcd, 'a', id, layout)
        + include_str!("../../../bench/remote-host-a.toml");
    text.replace(
        "hw_pps_limit = 400.0",
        &format!("hw_pps_limit = 400.0\nshards = {shards}"),
    )
}

/// Host P: a pool host with 2 cores to offer, its service on its underlay address.
fn host_p(name: &str, state: &Path, etcd: &str, id: &str, net: &str, layout: Layout) -> String {
    header(name, state, etcd, 'p', id, layout)
        + &format!("pool_cores = 2\npool_listen = \"{net}.102:7400\"\npool_cpus = \"0-1\"\n")
        + include_str!("../../../bench/remote-host-p.toml")
}

/// The underlay `net`.0/24: a namespace with a bridge, and each host's own namespace with a
/// veth into it (`.101` for A, `.102` for P); with `root`, the test's namespace too (`.250`).
/// All removed when dropped (the test's veth goes with its peer in the underlay).
struct Underlay {
    namespaces: Vec<String>,
}

impl Underlay {
    fn create(id: &str, net: &str, root: bool) -> Underlay {
        let ip = |args: &[&str]| {
            let s = Command::new("ip").args(args).status().expect("run ip");
            assert!(s.success(), "ip {args:?}");
        };
        let ul = format!("ur-{id}");
        let hosts = [(1, format!("ha-{id}")), (2, format!("hp-{id}"))];
        let mut u = Underlay {
            namespaces: Vec::new(),
        };
        for ns in std::iter::once(&ul).chain(hosts.iter().map(|h| &h.1)) {
            // A leftover of an earlier run that was killed: the names are this test's own.
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
            ip(&["netns", "add", ns]);
            u.namespaces.push(ns.clone());
        }
        ip(&["-n", &ul, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &ul, "link", "set", "br0", "up"]);
        for (i, ns) in &hosts {
            let (v, w) = (format!("v{i}{id}"), format!("w{i}{id}"));
            ip(&["link", "add", &v, "type", "veth", "peer", "name", &w]);
            ip(&["link", "set", &v, "netns", &ul]);
            ip(&["link", "set", &w, "netns", ns]);
            ip(&["-n", &ul, "link", "set", &v, "master", "br0", "up"]);
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{net}.10{i}/24"),
                "dev",
                &w,
            ]);
            ip(&["-n", ns, "link", "set", &w, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        if root {
            let (r, t) = (format!("r{id}"), format!("t{id}"));
            ip(&["link", "add", &r, "type", "veth", "peer", "name", &t]);
            ip(&["link", "set", &t, "netns", &ul]);
            ip(&["-n", &ul, "link", "set", &t, "master", "br0", "up"]);
            ip(&["addr", "add", &format!("{net}.250/24"), "dev", &r]);
            ip(&["link", "set", &r, "up"]);
        }
        u
    }
}

impl Drop for Underlay {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// One host: its testbed and folder, and its daemon.
struct Host {
    config: PathBuf,
    dir: tempfile::TempDir,
    daemon: Daemon,
}

impl Host {
    fn start(name: &str, text: impl Fn(&Path) -> String) -> Host {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(&config, text(dir.path())).expect("testbed");
        let daemon = Daemon(Some(common::spawn_run(
            BIN,
            &config,
            dir.path(),
            "auto",
            "info",
            Duration::from_secs(30),
        )));
        Host {
            config,
            dir,
            daemon,
        }
    }

    fn status(&self) -> serde_json::Value {
        common::ctl(BIN, &self.config, &["status"])
    }

    /// `SIGKILL`, then what its next start would do first: remove its leftovers (its VM's
    /// namespace, the pool's plane and files) as its ledgers list them.
    fn kill(&mut self) {
        if let Some(mut d) = self.daemon.0.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        let name = self
            .config
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for instance in [format!("{name}-pool"), name] {
            let scope = spillway_rt::host::ledger::LedgerScope::new(self.dir.path(), &instance)
                .allow_exe(Path::new(BIN));
            spillway_rt::host::ledger::Ledger::recover_in(self.dir.path(), &instance, &scope)
                .expect("the killed host's leftovers removed");
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    fn events(&self) -> Vec<serde_json::Value> {
        self.status()["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// The redis pinger from VM `a` to redis in VM `b` (`common::redis_pinger`), every PONG
/// within 5 s.
fn redis_pinger(ns: &str, secs: u32) -> Child {
    common::redis_pinger(ns, "10.74.0.2:6380", secs, 5)
}

/// The pinger's PONGs and longest gap; panics with its output if it failed.
fn pinger_result(c: Child) -> (u64, f64) {
    let out = common::finish(c, "the redis connection");
    let mut it = out.split_whitespace();
    (
        it.next().and_then(|v| v.parse().ok()).unwrap_or(0),
        it.next().and_then(|v| v.parse().ok()).unwrap_or(0.0),
    )
}

/// The bed: etcd, the underlay, both hosts, redis in A's VM `b`, and the pinger from `a`.
struct Bed {
    a: Host,
    p: Host,
    ns_a: String,
    _redis: Killed,
    _underlay: Underlay,
    _etcd: spillway_testkit::Etcd,
}

/// The bed; `test` (one letter) tells its names and its underlay's addresses from the other
/// test's, which may run at the same time.
fn bed(tag: &str, test: char, layout: Layout) -> Option<Bed> {
    if !spillway_testkit::prerequisites(&["ip", "ping", "python3", "redis-server"]) {
        return None;
    }
    let id = format!("{:x}{test}", std::process::id() % 0xffff);
    let (net, root) = match layout {
        Layout::Shared => ("192.0.2", false),
        Layout::HostNamespaces => ("198.51.100", true),
    };
    let underlay = Underlay::create(&id, net, root);
    let etcd = match layout {
        Layout::Shared => spillway_testkit::Etcd::start(tag)?,
        Layout::HostNamespaces => {
            spillway_testkit::Etcd::start_on(tag, format!("{net}.250").parse().unwrap())?
        }
    };
    let (na, np) = (format!("a{id}"), format!("p{id}"));
    let p = Host::start(&np, |d| host_p(&np, d, &etcd.endpoint, &id, net, layout));
    let a = Host::start(&na, |d| host_a(&na, d, &etcd.endpoint, &id, layout));
    let ns_b = format!("{na}-b");
    let redis = Killed(
        common::netns_exec(&ns_b, "redis-server")
            .args(common::REDIS_ARGS)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    common::wait_listening(&ns_b, 6380);
    Some(Bed {
        a,
        p,
        ns_a: format!("{na}-a"),
        _redis: redis,
        _underlay: underlay,
        _etcd: etcd,
    })
}

impl Bed {
    /// A ping flood from `a` to `b` (the pressure), killed when dropped.
    fn flood(&self) -> Killed {
        self.ping(0.002)
    }

    /// Pings from `a` to `b` every `interval` seconds, until dropped.
    fn ping(&self, interval: f64) -> Killed {
        Killed(
            common::netns_exec(&self.ns_a, "ping")
                .args(["-i", &interval.to_string(), "-q", "10.74.0.2"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("ping"),
        )
    }

    /// Waits until A's plane runs on P and has served frames; returns A's status then and the
    /// seconds from URSched's fallback (the trigger) to the first redirected packet the plane
    /// served (the core's `absorbing` event), both on A's clock.
    fn wait_remote_plane(&self) -> (serde_json::Value, f64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.a.status();
            let at = |name: &str| {
                s["events"].as_array().and_then(|v| {
                    v.iter()
                        .find(|e| e["event"] == name)
                        .and_then(|e| e["at_s"].as_f64())
                })
            };
            let back = s["counters"]["rt.from_plane.frames"].as_u64().unwrap_or(0);
            if let (Some(trigger), Some(first), true) = (at("fallback"), at("absorbing"), back > 0)
            {
                pool_serves_one_guest(&self.p.status());
                return (s, first - trigger);
            }
            assert!(
                Instant::now() < deadline,
                "no remote plane within 30 s: {s:#}\nA's log: {}\nP's log: {}",
                self.a.log(),
                self.p.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// P serves exactly one guest (A), on a plane that runs.
fn pool_serves_one_guest(pool: &serde_json::Value) {
    let guests = pool["pool"]["guests"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(guests.len(), 1, "P's pool: {pool:#}");
    assert!(guests[0]["pid"].as_u64().unwrap_or(0) > 0, "{pool:#}");
}

#[test]
fn a_host_without_cores_spills_to_a_pool_host_and_fails_open_when_it_dies() {
    let Some(mut bed) = bed("rtremote-kill", 'k', Layout::Shared) else {
        return;
    };
    let pinger = redis_pinger(&bed.ns_a, 15);
    let flood = bed.flood();
    let (s, trigger_to_first) = bed.wait_remote_plane();
    eprintln!("trigger -> first frame served by the pool host: {trigger_to_first:.3} s");
    let reserved = &s["cluster"]["reserved"];
    assert_eq!(reserved["cores"], 2, "{s:#}");
    assert!(
        s["counters"]["dpu.failopen"].as_u64().unwrap_or(0) == 0,
        "{s:#}"
    );
    // Let the plane serve (and sync) a while, then kill P outright.
    std::thread::sleep(Duration::from_secs(3));
    let served = bed.a.status()["counters"]["rt.from_plane.frames"]
        .as_u64()
        .unwrap_or(0);
    bed.p.kill();
    let failed_open = wait_for(Duration::from_secs(10), "A fails open", || {
        let s = bed.a.status();
        (s["counters"]["dpu.failopen"].as_u64().unwrap_or(0) >= 1).then_some(s)
    });
    drop(flood);
    let (pongs, gap_ms) = pinger_result(pinger);
    let events: Vec<String> = bed
        .a
        .events()
        .iter()
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    eprintln!(
        "{served} frames served remotely; {pongs} PONGs, longest gap {gap_ms} ms; events {events:?}"
    );
    assert!(served > 100, "{failed_open:#}");
    assert!(pongs > 300, "{pongs} PONGs");
    // Once: the dead pool's grant went with its plane, so no plane was started there again.
    let count = |name: &str| events.iter().filter(|e| *e == name).count();
    assert_eq!(count("fail_open"), 1, "{events:?}");
    assert_eq!(count("preparing"), 1, "{events:?}");
    // And the cores held there are given back.
    wait_for(Duration::from_secs(5), "the reservation given back", || {
        bed.a.status()["cluster"]["reserved"]
            .is_null()
            .then_some(())
    });
}

#[test]
fn a_remote_plane_comes_home_when_the_host_has_cores_again() {
    let Some(bed) = bed("rtremote-home", 'h', Layout::HostNamespaces) else {
        return;
    };
    let pinger = redis_pinger(&bed.ns_a, 15);
    let _flood = bed.flood();
    // Eight more ICMP connections (each ping its own id), so that both forwarding threads,
    // and both lanes of the link, carry some.
    let _pings: Vec<Killed> = (0..8).map(|_| bed.ping(0.1)).collect();
    let (s, trigger_to_first) = bed.wait_remote_plane();
    eprintln!("trigger -> first frame served by the pool host: {trigger_to_first:.3} s");
    assert_eq!(s["plane"]["remote"], true, "{s:#}");
    // Both of the remote plane's shards take frames: both lanes cross the link.
    wait_for(
        Duration::from_secs(10),
        "frames on both of the plane's shards",
        || {
            let s = bed.a.status();
            let shards = s["plane"]["stats"]["shards"].as_array().cloned()?;
            (shards.len() == 2 && shards.iter().all(|t| t["frames_in"].as_u64() > Some(0)))
                .then_some(())
        },
    );
    // The tenants give two cores back: 4 - 0 - 2 = 2 isolatable here.
    let r = common::ctl(BIN, &bed.a.config, &["tenant-cores", "0"]);
    assert_eq!(r["isolatable_cores"], 2, "{r}");
    // URSched releases the remote plane (its connections come back to the DPU), and, the
    // flood going on, starts one on this host's own cores.
    let local = wait_for(
        Duration::from_secs(20),
        "a local plane after the remote one",
        || {
            let s = bed.a.status();
            let home = s["events"].as_array().is_some_and(|v| {
                v.iter().any(|e| {
                    e["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("overflow comes home"))
                })
            });
            let local = s["phase"] == "active" && s["plane"]["remote"] == false;
            (home && local).then_some(s)
        },
    );
    // The pool's cores are given back once nothing wants them, and P stops the guest's plane.
    wait_for(Duration::from_secs(10), "the pool's plane stopped", || {
        let p = bed.p.status();
        p["pool"]["guests"]
            .as_array()
            .is_some_and(|g| g.is_empty())
            .then_some(())
    });
    let (pongs, gap_ms) = pinger_result(pinger);
    let events: Vec<String> = local["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    eprintln!("{pongs} PONGs, longest gap {gap_ms} ms; events {events:?}");
    // Each plane's start, from the core's decision to its first redirected packet served:
    // the remote one first, then the local one (events come newest first).
    let mut starts = Vec::new();
    let mut prepared = None;
    for e in local["events"].as_array().unwrap().iter().rev() {
        let at = e["at_s"].as_f64().unwrap_or(0.0);
        match e["event"].as_str() {
            Some("preparing") => prepared = Some(at),
            Some("absorbing") => starts.extend(prepared.take().map(|p| at - p)),
            _ => {}
        }
    }
    eprintln!("decision -> first packet served: remote plane, then local plane: {starts:?} s");
    assert_eq!(starts.len(), 2, "{events:?}");
    assert!(pongs > 300, "{pongs} PONGs");
    assert_eq!(local["counters"]["dpu.failopen"], 0, "{local:#}");
}
