//! The pool service: a pool host's side of the remote plane (a thread of its DPU process,
//! started with `[cluster] pool_cores` and `pool_listen`).
//!
//! It listens on the host's underlay address. A connection says which host it is, its token,
//! its lanes, workers and clock origin, and the testbed its plane builds its pipeline from.
//! The service serves it only if the cluster store holds a reservation of that host on this
//! pool with that token (compared in constant time), with at most the reserved cores as
//! workers. It then writes the guest's testbed (the host's `[testbed]`, `[fabric]`,
//! `[policy]` and `[[vm]]`, under this host's own `[spill]`: the plane runs as this host
//! says, never as the guest asks), starts `spillway spill-plane` on it in the pool's cgroup,
//! authenticates it as the DPU process does its own (pid and secret), creates the vNIC set,
//! answers, and pumps records between the set and the connection until either goes.
//!
//! Bounds: at most [`GUESTS_MAX`] links at once (and one per host), a hello of at most
//! [`link::HELLO_MAX`] bytes within 2 s, a plane that connects within 5 s. Everything a guest
//! creates (its testbed file, its socket, its plane) is in the pool's own ledger
//! (`<testbed>-pool`) before it exists, so a crash leaves nothing the next start cannot remove.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use spillway_cluster::{Cluster, Store};

use crate::host::cgroup::{Cgroup, CgroupSpec};
use crate::host::ledger::{Ledger, LedgerEntry};
use crate::remote::link::{self, Pump};
use crate::shm::vnic::{LANES_MAX, VnicSet};
use crate::testbed::Testbed;

/// Links served at once, at most.
pub const GUESTS_MAX: usize = 16;

/// How long a guest's plane may take to connect.
const PLANE_CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// What the service needs.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// This pool host's name in the cluster.
    pub pool_host: String,
    /// Where to listen (the host's underlay address).
    pub listen: SocketAddr,
    /// The namespace that address lives in (entered by the service's thread only).
    pub netns: Option<String>,
    /// The etcd members to check reservations with.
    pub etcd: Vec<String>,
    /// Where guests' files go.
    pub state_dir: PathBuf,
    /// The ledger's name, and its cgroup's with `-planes`: `<testbed>-pool`.
    pub instance: String,
    /// The `spillway` binary the planes run.
    pub plane_exe: PathBuf,
    /// The pool's cpuset.
    pub cpus: String,
    /// The pool's memory limit, bytes.
    pub memory_max: Option<u64>,
    /// This host's `[spill]` table, which every guest's plane runs under.
    pub spill: toml::Table,
    /// Cores offered: workers of all guests together stay within it.
    pub cores: u32,
}

/// One guest as `ctl status` shows it.
#[derive(Clone, Debug, serde::Serialize)]
struct GuestStatus {
    host: String,
    pid: u32,
    workers: u32,
}

#[derive(Debug, Default)]
struct State {
    guests: Vec<GuestStatus>,
    served: u64,
    refused: u64,
    last_refusal: Option<String>,
}

/// The running service.
#[derive(Debug)]
pub struct PoolService {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    state: Arc<Mutex<State>>,
    ledger: Arc<Mutex<Ledger>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PoolService {
    /// Recovers what a crashed predecessor left, creates the pool's cgroup, binds (inside
    /// `spec.netns`) and starts serving.
    pub fn start(spec: PoolSpec) -> Result<PoolService, String> {
        let scope = crate::host::ledger::LedgerScope::new(&spec.state_dir, &spec.instance)
            .allow_exe(&spec.plane_exe);
        Ledger::recover_in(&spec.state_dir, &spec.instance, &scope)
            .map_err(|e| format!("recovering the pool's leftovers: {e}"))?;
        let mut ledger = Ledger::open(&spec.state_dir, &spec.instance)
            .map_err(|e| format!("the pool's ledger: {e}"))?;
        // Named after the instance, as recovery's scope wants (the instance and more).
        let cgroup = ledger
            .create_cgroup(
                &format!("{}-planes", spec.instance),
                &CgroupSpec {
                    cpus: spec.cpus.clone(),
                    mems: "0".into(),
                    memory_max: spec.memory_max,
                },
            )
            .map_err(|e| format!("the pool's cgroup: {e}"))?;
        let cluster = Cluster::new(Store::etcd(&spec.etcd).map_err(|e| e.to_string())?);
        let ledger = Arc::new(Mutex::new(ledger));
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(State::default()));
        let thread = {
            let (stop, state, ledger) = (stop.clone(), state.clone(), ledger.clone());
            std::thread::Builder::new()
                .name("pool".into())
                .spawn(move || {
                    let listener = bind_in(&spec);
                    let ok = listener.as_ref().map(|_| ()).map_err(Clone::clone);
                    let _ = bound_tx.send(ok);
                    if let Ok(l) = listener {
                        let ctx = Arc::new(Ctx {
                            spec,
                            cluster,
                            cgroup,
                            ledger,
                            state,
                            stop,
                        });
                        accept_loop(&ctx, &l);
                    }
                })
                .map_err(|e| format!("starting the pool thread: {e}"))?
        };
        let mut svc = PoolService {
            stop,
            thread: Some(thread),
            state,
            ledger,
        };
        match bound_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                svc.stop();
                return Err(e);
            }
            Err(_) => {
                svc.stop();
                return Err("the pool thread ended before binding".into());
            }
        }
        Ok(svc)
    }

    /// `ctl status`'s `pool`.
    pub fn status(&self) -> serde_json::Value {
        let s = lock(&self.state);
        json!({
            "guests": s.guests,
            "served": s.served,
            "refused": s.refused,
            "last_refusal": s.last_refusal,
        })
    }

    /// Stops serving: every link closes, every guest's plane is stopped, and what the pool
    /// created is removed.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let report = lock(&self.ledger).cleanup();
        if !report.failed.is_empty() {
            tracing::warn!(target: "spillway::run", failed = report.failed.len(), "pool: some of what the guests created could not be removed");
        }
    }
}

impl Drop for PoolService {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The listener, bound in the host's namespace: the thread enters it (only this thread: a
/// namespace is per thread), binds, and keeps serving from there.
fn bind_in(spec: &PoolSpec) -> Result<TcpListener, String> {
    if let Some(ns) = &spec.netns {
        crate::host::netns::enter(ns)?;
    }
    let l = TcpListener::bind(spec.listen)
        .map_err(|e| format!("pool service: binding {}: {e}", spec.listen))?;
    l.set_nonblocking(true)
        .map_err(|e| format!("pool service: {e}"))?;
    Ok(l)
}

/// What every guest thread shares.
struct Ctx {
    spec: PoolSpec,
    cluster: Cluster<Store>,
    cgroup: Cgroup,
    ledger: Arc<Mutex<Ledger>>,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

fn accept_loop(ctx: &Arc<Ctx>, listener: &TcpListener) {
    let mut guests: Vec<std::thread::JoinHandle<()>> = Vec::new();
    while !ctx.stop.load(Ordering::Relaxed) {
        guests.retain(|g| !g.is_finished());
        match listener.accept() {
            Ok((tcp, peer)) => {
                if guests.len() >= GUESTS_MAX {
                    refuse(ctx, tcp, &format!("{GUESTS_MAX} links already served"));
                    continue;
                }
                let c = ctx.clone();
                match std::thread::Builder::new()
                    .name("pool-guest".into())
                    .spawn(move || serve(&c, tcp, peer))
                {
                    Ok(h) => guests.push(h),
                    Err(e) => {
                        tracing::warn!(target: "spillway::run", error = %e, "pool: could not start a guest thread");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Until a connection comes (at once), or 100 ms to look at the stop flag.
                let mut fds = [rustix::event::PollFd::new(
                    listener,
                    rustix::event::PollFlags::IN,
                )];
                let ts = rustix::time::Timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                };
                let _ = rustix::event::poll(&mut fds, Some(&ts));
            }
            Err(e) => {
                tracing::warn!(target: "spillway::run", error = %e, "pool: accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    for g in guests {
        let _ = g.join();
    }
}

fn refuse(ctx: &Ctx, mut tcp: TcpStream, why: &str) {
    // Counted before the answer goes: a peer that has the answer finds it in the status.
    {
        let mut s = lock(&ctx.state);
        s.refused += 1;
        s.last_refusal = Some(why.to_string());
    }
    tracing::warn!(target: "spillway::run", why, "pool: refused a link");
    // A peer that does not read cannot hold the accept loop for more than this.
    let _ = tcp.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = link::send_json(&mut tcp, &json!({"ok": false, "error": why}));
}

/// A guest's hello, checked.
struct Hello {
    host: String,
    token: String,
    lanes: usize,
    workers: u32,
    clock_origin_ns: u64,
    testbed: String,
}

fn parse_hello(doc: &serde_json::Value) -> Result<Hello, String> {
    let text = |k: &str| {
        doc[k]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("hello.{k}: expected a string"))
    };
    let num = |k: &str, max: u64| {
        doc[k]
            .as_u64()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| format!("hello.{k}: expected 1..={max}"))
    };
    let host = text("host")?;
    if !spillway_cluster::valid_name(&host) {
        return Err("hello.host: expected 1 to 64 of [A-Za-z0-9._-]".into());
    }
    Ok(Hello {
        host,
        token: text("token")?,
        lanes: num("lanes", LANES_MAX as u64)? as usize,
        workers: num("workers", 1024)? as u32,
        clock_origin_ns: doc["clock_origin_ns"]
            .as_u64()
            .ok_or("hello.clock_origin_ns: expected a whole number")?,
        testbed: text("testbed")?,
    })
}

/// The guest's testbed: its `[testbed]` name and frame format, `[fabric]`, `[policy]` and
/// `[[vm]]`, with this host's `[spill]` and state directory; nothing else of it (its uplink,
/// cluster and operations sections are its host's business).
fn guest_testbed(text: &str, spec: &PoolSpec) -> Result<String, String> {
    let mut t: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("the guest's testbed: {}", e.message()))?;
    let mut g = toml::Table::new();
    for k in ["testbed", "fabric", "policy", "vm"] {
        if let Some(v) = t.remove(k) {
            g.insert(k.into(), v);
        }
    }
    // Of `[testbed]` only what a plane reads: where the DPU process runs, its hold, its
    // guests and the rest are its host's.
    if let Some(toml::Value::Table(tb)) = g.get_mut("testbed") {
        tb.retain(|k, _| k == "name" || k == "vnet_hdr");
        tb.insert(
            "state_dir".into(),
            toml::Value::String(spec.state_dir.display().to_string()),
        );
    }
    g.insert("spill".into(), toml::Value::Table(spec.spill.clone()));
    toml::to_string(&g).map_err(|e| format!("writing the guest's testbed: {e}"))
}

fn serve(ctx: &Arc<Ctx>, mut tcp: TcpStream, peer: SocketAddr) {
    let host = match admit(ctx, &mut tcp) {
        Ok(h) => h,
        Err(e) => {
            refuse(ctx, tcp, &e);
            return;
        }
    };
    let started = Instant::now();
    let mut guest = match start_guest(ctx, &host) {
        Ok(g) => g,
        Err(e) => {
            lock(&ctx.state)
                .guests
                .retain(|g| g.host != host.host || g.pid != 0);
            refuse(ctx, tcp, &e);
            return;
        }
    };
    let pid = guest.plane.id();
    {
        let mut s = lock(&ctx.state);
        s.served += 1;
        if let Some(g) = s
            .guests
            .iter_mut()
            .find(|g| g.host == host.host && g.pid == 0)
        {
            g.pid = pid;
        }
    }
    tracing::info!(target: "spillway::run", host = %host.host, %peer, pid, workers = guest.workers, start_ms = started.elapsed().as_secs_f64() * 1e3, "pool: serving a remote plane");
    let answered = link::send_json(
        &mut tcp,
        &json!({"ok": true, "pid": pid, "workers": guest.workers}),
    );
    let r = answered.and_then(|()| {
        let mut pump = Pump::new(tcp)?;
        let r = pump.run(&mut guest.vnic, || ctx.stop.load(Ordering::Relaxed));
        tracing::info!(target: "spillway::run", host = %host.host, counters = ?pump.counters, "pool: link done");
        r
    });
    if let Err(e) = r {
        tracing::info!(target: "spillway::run", host = %host.host, error = %e, "pool: link ended");
    }
    guest.stop();
    lock(&ctx.state).guests.retain(|g| g.host != host.host);
}

/// Reads and checks the hello, and the guest's reservation; registers the guest (pid 0 until
/// its plane runs) so that a second link from the same host is refused meanwhile.
fn admit(ctx: &Ctx, tcp: &mut TcpStream) -> Result<Hello, String> {
    tcp.set_write_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let doc = link::recv_json(tcp, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    let mut h = parse_hello(&doc)?;
    let grant = ctx
        .cluster
        .grant(&ctx.spec.pool_host, &h.host)
        .map_err(|e| format!("reading the reservation: {e}"))?
        .ok_or_else(|| {
            format!(
                "host {} holds no reservation on {}",
                h.host, ctx.spec.pool_host
            )
        })?;
    if !crate::shm::vnic::secrets_equal(grant.token.as_bytes(), h.token.as_bytes()) {
        return Err(format!("wrong token for host {}", h.host));
    }
    h.workers = h.workers.min(grant.cores).max(1);
    let mut s = lock(&ctx.state);
    if s.guests.iter().any(|g| g.host == h.host) {
        return Err(format!("host {} already has a link here", h.host));
    }
    let used: u32 = s.guests.iter().map(|g| g.workers).sum();
    if used + h.workers > ctx.spec.cores.max(1) {
        return Err(format!(
            "{used} of {} pool cores in use; {} more do not fit",
            ctx.spec.cores, h.workers
        ));
    }
    s.guests.push(GuestStatus {
        host: h.host.clone(),
        pid: 0,
        workers: h.workers,
    });
    Ok(h)
}

/// A guest's plane and the files made for it.
struct Guest {
    plane: Child,
    vnic: VnicSet,
    workers: u32,
    files: Vec<PathBuf>,
}

impl Guest {
    fn stop(&mut self) {
        crate::host::signals::terminate(&mut self.plane, Duration::from_secs(2));
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn start_guest(ctx: &Ctx, h: &Hello) -> Result<Guest, String> {
    let spec = &ctx.spec;
    let stem = format!("{}-{}", spec.instance, h.host);
    let config = spec.state_dir.join(format!("{stem}.toml"));
    let socket = spec.state_dir.join(format!("{stem}.sock"));
    let text = guest_testbed(&h.testbed, spec)?;
    let mut files = Vec::new();
    let cleanup = |files: &[PathBuf]| {
        for f in files {
            let _ = std::fs::remove_file(f);
        }
    };
    let r = (|| {
        write_private(ctx, &config, text.as_bytes())?;
        files.push(config.clone());
        let tb = Testbed::load(&config).map_err(|e| format!("the guest's testbed: {e}"))?;
        let lanes = tb.fabric.dpu.shards.max(1) as usize;
        if lanes != h.lanes {
            return Err(format!(
                "the link has {} lanes, the guest's testbed {lanes} shards",
                h.lanes
            ));
        }
        let listener = lock(&ctx.ledger)
            .bind_socket(&socket, None)
            .map_err(|e| format!("the guest's vNIC socket: {e}"))?;
        files.push(socket.clone());
        let crate::plane::process::Launch {
            mut cmd,
            secret,
            secret_w,
        } = crate::plane::process::launch(
            &spec.plane_exe,
            &config,
            &socket,
            h.workers,
            h.clock_origin_ns,
        )
        .map_err(|e| format!("the plane's handshake secret: {e}"))?;
        let mut plane = lock(&ctx.ledger)
            .spawn(&mut cmd)
            .map_err(|e| format!("starting the guest's plane: {e}"))?;
        drop(cmd);
        let pid = plane.id();
        let connected = (|| {
            ctx.cgroup
                .add_pid(pid)
                .map_err(|e| format!("moving the plane into the pool's cgroup: {e}"))?;
            crate::plane::process::hand_secret(secret_w, &secret, &[])
                .map_err(|e| format!("handing the plane its secret: {e}"))?;
            let stream = accept_plane(&listener, &mut plane)?;
            crate::shm::vnic::check_auth(&stream, &secret, Duration::from_secs(1))
                .map_err(|e| format!("the plane's handshake: {e}"))?;
            VnicSet::create(stream, &format!("workers={}", h.workers), lanes)
                .map_err(|e| format!("the guest's vNIC set: {e}"))
        })();
        match connected {
            Ok(vnic) => Ok(Guest {
                plane,
                vnic,
                workers: h.workers,
                files: files.clone(),
            }),
            Err(e) => {
                let _ = plane.kill();
                let _ = plane.wait();
                Err(e)
            }
        }
    })();
    if r.is_err() {
        cleanup(&files);
    }
    r
}

/// The plane's connection: from the pid we started, within [`PLANE_CONNECT_WITHIN`].
fn accept_plane(
    listener: &UnixListener,
    plane: &mut Child,
) -> Result<std::os::unix::net::UnixStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + PLANE_CONNECT_WITHIN;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let cred = crate::host::unixsock::peer_cred(&stream).map_err(|e| e.to_string())?;
                if cred.pid == plane.id() {
                    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                    return Ok(stream);
                }
                tracing::warn!(target: "spillway::run", pid = cred.pid, "pool: refused a vNIC connection not from the guest's plane");
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accepting the plane: {e}")),
        }
        if let Ok(Some(status)) = plane.try_wait() {
            return Err(format!(
                "the guest's plane exited ({status}) before connecting"
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the guest's plane did not connect within {PLANE_CONNECT_WITHIN:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes `bytes` to a new file `path`, mode 0600 whatever the umask (a stale one of a
/// crashed run replaced), then records it, as [`Ledger::bind_socket`] does a socket.
fn write_private(ctx: &Ctx, path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let written = std::io::Write::write_all(&mut f, bytes)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|()| {
            lock(&ctx.ledger)
                .record(LedgerEntry::File(path.to_owned()))
                .map_err(|e| format!("ledger: {e}"))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PoolSpec {
        let spill: toml::Table = "uid = 65534\ngid = 65534\nseccomp = \"kill\""
            .parse()
            .unwrap();
        PoolSpec {
            pool_host: "p".into(),
            listen: "127.0.0.1:7400".parse().unwrap(),
            netns: None,
            etcd: vec![],
            state_dir: "/run/spillway-pool".into(),
            instance: "p-pool".into(),
            plane_exe: "/bin/false".into(),
            cpus: "1".into(),
            memory_max: None,
            spill,
            cores: 2,
        }
    }

    #[test]
    fn a_guest_plane_runs_under_the_pool_hosts_spill_section_never_its_own() {
        let guest = r#"
[testbed]
name = "a1"
state_dir = "/somewhere/else"
netns = "elsewhere"
guest_dir = "/x"
[spill]
uid = 0
gid = 0
seccomp = "log"
[ops]
metrics_addr = "127.0.0.1:9464"
[cluster]
etcd = ["http://127.0.0.1:2379"]
[uplink]
netns = "u"
[fabric.dpu]
hw_pps_limit = 10.0
[policy.host]
uplink_port = 0
[[vm]]
name = "a"
port = 1
"#;
        let t: toml::Table = guest_testbed(guest, &spec()).unwrap().parse().unwrap();
        assert_eq!(t["spill"]["uid"].as_integer(), Some(65534));
        assert_eq!(t["spill"]["seccomp"].as_str(), Some("kill"));
        assert_eq!(
            t["testbed"]["state_dir"].as_str(),
            Some("/run/spillway-pool")
        );
        assert_eq!(t["testbed"]["name"].as_str(), Some("a1"));
        assert!(
            !t["testbed"].as_table().unwrap().contains_key("netns"),
            "{t:?}"
        );
        assert!(
            !t["testbed"].as_table().unwrap().contains_key("guest_dir"),
            "{t:?}"
        );
        for gone in ["ops", "cluster", "uplink"] {
            assert!(!t.contains_key(gone), "{gone}: {t:?}");
        }
        assert_eq!(t["fabric"]["dpu"]["hw_pps_limit"].as_float(), Some(10.0));
        assert!(t.contains_key("policy") && t.contains_key("vm"));
        assert!(guest_testbed("not [toml", &spec()).is_err());
    }

    #[test]
    fn a_hello_names_a_valid_host_and_bounded_numbers() {
        let good = serde_json::json!({
            "host": "a-1", "token": "ff", "lanes": 2, "workers": 3,
            "clock_origin_ns": 5, "testbed": "",
        });
        let h = parse_hello(&good).unwrap();
        assert_eq!((h.host.as_str(), h.lanes, h.workers), ("a-1", 2, 3));
        for (k, v) in [
            ("host", serde_json::json!("../etc")),
            ("lanes", serde_json::json!(0)),
            ("lanes", serde_json::json!(LANES_MAX + 1)),
            ("workers", serde_json::json!(5000)),
            ("token", serde_json::json!(7)),
            ("clock_origin_ns", serde_json::json!(-1)),
        ] {
            let mut bad = good.clone();
            bad[k] = v;
            assert!(parse_hello(&bad).is_err(), "{k}");
        }
    }
}
