//! The DPU process's cluster agent (`[cluster]` in the testbed): a thread that keeps this host's
//! record in the cluster control plane (`spillway_cluster`) and brings back the cluster
//! baseline for URSched.
//!
//! The forwarding loop never waits on the network: once a second ([`ClusterAgent::exchange`],
//! from its publishing step) it leaves the newest record in a shared slot and reads the newest
//! baseline, and every 100 ms it leaves the cores URSched wants from a pool
//! ([`ClusterAgent::want_remote`]) and reads what is held there, all behind a mutex held for a
//! copy. The thread does the rest, each request bounded by the etcd client's timeout:
//!
//! - connect, take a lease of `lease_ttl`, and follow the baseline with a watch;
//! - a pool host (`cluster.pool_cores`) offers its cores under the lease;
//! - every second, renew the lease and publish the record left in the slot; while URSched
//!   wants cores it cannot find here (a fallback), reserve them on the pool host with most
//!   free (with a fresh token for its service, and its endpoint read back), and release them
//!   once it no longer does; a change of what URSched wants wakes the thread at once;
//! - on any error, forget the connection and start again a second later (the record
//!   disappears from the cluster when the lease runs out, as a dead host's would);
//! - at stop, revoke the lease, so the record goes at once.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spillway_cluster::{Cluster, HostRecord, LeaseId, PlaneState, Store, TenantLoad};
use spillway_fabric::dpu::Phase;

use crate::ops::service::{Readiness, StopSignal, StopWatch, stop_pair};
use crate::testbed::ClusterSpec;

/// How often the record is published and the lease renewed.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// How long a pool host whose plane failed is not reserved on again: long enough for a dead
/// host's lease to lapse (and its offer with it), short enough that a restarted one is used.
pub const POOL_AVOID: Duration = Duration::from_secs(10);

/// What the loop and the thread share.
#[derive(Debug, Default)]
struct Slot {
    /// The newest record the loop left.
    record: Option<HostRecord>,
    /// The newest baseline the watch brought (normalised variance).
    baseline: Option<f64>,
    /// Cores URSched wants from a pool (its fallback), as the loop last said.
    want_remote: Option<u32>,
    /// What this host holds on a pool host.
    reserved: Option<RemoteGrant>,
    /// Pools whose plane failed: what is held there, to give back.
    give_back: Vec<String>,
    /// Pools whose plane failed, not to reserve on until then.
    avoid: Vec<(String, Instant)>,
    /// Whether the thread holds a live lease and published at least once on it.
    connected: bool,
    /// Records published.
    published: u64,
    /// The last error, if the last attempt failed.
    error: Option<String>,
}

/// Cores this host holds on a pool host, and how its plane reaches them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteGrant {
    /// The pool host.
    pub pool: String,
    /// Cores held.
    pub cores: u32,
    /// Its remote-plane service, if it advertises one.
    pub endpoint: Option<std::net::SocketAddr>,
    /// The token the relay presents (see `spillway_cluster::Cluster::set_token`).
    pub token: String,
}

/// A fresh token: a handshake secret's worth of the kernel's randomness, in hex.
fn new_token() -> std::io::Result<String> {
    Ok(crate::shm::vnic::new_secret()?
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect())
}

/// The agent: its thread, stopped and joined on drop.
#[derive(Debug)]
pub struct ClusterAgent {
    spec: ClusterSpec,
    slot: Arc<Mutex<Slot>>,
    /// Written when the cores wanted from a pool change: the thread acts at once instead of
    /// at its next second (a remote plane's start waits on it).
    poke: Arc<std::os::fd::OwnedFd>,
    stop: StopSignal,
    thread: Option<JoinHandle<()>>,
}

fn lock(slot: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    // Every write below is a whole-field store: a poisoned slot is still consistent.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// The plane's phase as the cluster sees it.
pub fn plane_state(phase: Phase) -> PlaneState {
    match phase {
        Phase::Idle => PlaneState::Idle,
        Phase::Preparing { .. } | Phase::Shadow { .. } | Phase::Activating { .. } => {
            PlaneState::Shadow
        }
        // Serving, or handing back what it served.
        _ => PlaneState::Active,
    }
}

/// This host's record from URSched's view.
pub fn host_record(
    loads: &[spillway_fabric::ursched::TenantLoad],
    spare_cores: u32,
    phase: Phase,
) -> HostRecord {
    HostRecord {
        tenants: loads
            .iter()
            .map(|l| TenantLoad {
                tenant: l.tenant.0,
                mean_pps: l.mean_pps,
                norm_variance: l.cv2,
            })
            .collect(),
        spare_cores,
        plane: plane_state(phase),
    }
}

impl ClusterAgent {
    /// Starts the agent's thread for `spec`.
    pub fn start(spec: &ClusterSpec) -> std::io::Result<ClusterAgent> {
        let slot = Arc::new(Mutex::new(Slot::default()));
        let (stop, watch) = stop_pair()?;
        let poke = Arc::new(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?);
        let thread = {
            let (spec, slot, poke) = (spec.clone(), Arc::clone(&slot), Arc::clone(&poke));
            std::thread::Builder::new()
                .name("cluster-agent".into())
                .spawn(move || agent(&spec, &slot, &poke, &watch))?
        };
        Ok(ClusterAgent {
            spec: spec.clone(),
            slot,
            poke,
            stop,
            thread: Some(thread),
        })
    }

    /// Leaves `record` to be published, and returns the newest baseline (`None`: none yet, or
    /// the control plane is unreachable and the host judges its tenants alone).
    pub fn exchange(&self, record: HostRecord) -> Option<f64> {
        let mut s = lock(&self.slot);
        s.record = Some(record);
        if s.connected { s.baseline } else { None }
    }

    /// The cores URSched wants from a pool (`None`: none). A change wakes the thread, which
    /// reserves or releases at once.
    pub fn want_remote(&self, want: Option<u32>) {
        let changed = {
            let mut s = lock(&self.slot);
            std::mem::replace(&mut s.want_remote, want) != want
        };
        if changed {
            // A full counter (never, at one write per change) only delays to the next second.
            let _ = rustix::io::write(&*self.poke, &1u64.to_ne_bytes());
        }
    }

    /// The plane on the pool host failed (or could not start): what is held there is given
    /// back, and that pool is not reserved on for [`POOL_AVOID`].
    pub fn pool_failed(&self) {
        {
            let mut s = lock(&self.slot);
            if let Some(r) = s.reserved.take() {
                tracing::warn!(pool = %r.pool, "cluster: the plane on the pool host failed; giving its cores back");
                s.avoid.push((r.pool.clone(), Instant::now() + POOL_AVOID));
                s.give_back.push(r.pool);
            }
        }
        let _ = rustix::io::write(&*self.poke, &1u64.to_ne_bytes());
    }

    /// The cores held on a pool host whose service can start a plane (one that advertises an
    /// endpoint), if any: what the loop reports to the core every 100 ms, without copying the
    /// grant.
    pub fn granted_cores(&self) -> Option<u32> {
        lock(&self.slot)
            .reserved
            .as_ref()
            .filter(|g| g.endpoint.is_some())
            .map(|g| g.cores)
    }

    /// What this host holds on a pool host now, if anything.
    pub fn remote_grant(&self) -> Option<RemoteGrant> {
        lock(&self.slot).reserved.clone()
    }

    /// The cluster settings it runs with.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// For `ctl status`.
    pub fn status(&self) -> serde_json::Value {
        let s = lock(&self.slot);
        serde_json::json!({
            "host": self.spec.host,
            "etcd": self.spec.etcd,
            "connected": s.connected,
            "published": s.published,
            "baseline": s.baseline,
            "pool_cores": self.spec.pool_cores,
            "wants_remote_cores": s.want_remote,
            "reserved": s.reserved.as_ref().map(|r| serde_json::json!({
                "pool": r.pool, "cores": r.cores, "endpoint": r.endpoint,
            })),
            "pool_listen": self.spec.pool_listen,
            "error": s.error,
        })
    }
}

impl Drop for ClusterAgent {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection's worth of state.
struct Session {
    cluster: Cluster<Store>,
    lease: LeaseId,
    baselines: std::sync::mpsc::Receiver<spillway_cluster::Baseline>,
}

fn open(spec: &ClusterSpec) -> spillway_cluster::Result<Session> {
    let cluster = Cluster::new(Store::etcd(&spec.etcd)?);
    let lease = cluster.lease(spec.lease_ttl)?;
    if spec.pool_cores > 0 {
        cluster.offer(&spec.host, spec.pool_cores, lease)?;
        if let Some(a) = spec.pool_listen {
            cluster.advertise(&spec.host, &a.to_string(), lease)?;
        }
    }
    let baselines = cluster.watch_baseline()?;
    Ok(Session {
        cluster,
        lease,
        baselines,
    })
}

/// One round on a session: renew, publish, take the newest baseline.
fn round(spec: &ClusterSpec, s: &Session, slot: &Mutex<Slot>) -> spillway_cluster::Result<()> {
    use spillway_cluster::Kv;
    s.cluster.kv().keep_alive(s.lease)?;
    let record = lock(slot).record.clone();
    if let Some(r) = record {
        s.cluster.publish(&spec.host, &r, s.lease)?;
        let mut g = lock(slot);
        g.published += 1;
        g.connected = true;
        g.error = None;
    }
    if let Some(b) = s.baselines.try_iter().last() {
        lock(slot).baseline = Some(b.norm_variance);
    }
    // Remote cores: reserve while wanted, release when not. A reservation goes with the
    // lease, so a session lost takes it too (`agent` forgets it then).
    let (want, held, give_back, avoid) = {
        let mut g = lock(slot);
        let now = Instant::now();
        g.avoid.retain(|(_, until)| *until > now);
        let avoid: Vec<String> = g.avoid.iter().map(|(p, _)| p.clone()).collect();
        let give_back = std::mem::take(&mut g.give_back);
        (g.want_remote, g.reserved.clone(), give_back, avoid)
    };
    for pool in give_back {
        s.cluster.release(&pool, &spec.host)?;
    }
    match (want, held) {
        (Some(cores), None) => match s
            .cluster
            .reserve_anywhere(&spec.host, cores, s.lease, &avoid)?
        {
            Some(pool) => {
                let token = new_token().map_err(|e| {
                    spillway_cluster::ClusterError::Backend(format!("a token: {e}"))
                })?;
                s.cluster.set_token(&pool, &spec.host, &token, s.lease)?;
                let endpoint = s.cluster.pool(&pool)?.endpoint.and_then(|e| e.parse().ok());
                tracing::info!(pool = %pool, cores, endpoint = ?endpoint, "cluster: reserved pool cores");
                lock(slot).reserved = Some(RemoteGrant {
                    pool,
                    cores,
                    endpoint,
                    token,
                });
            }
            None => tracing::debug!(cores, "cluster: no pool host has room"),
        },
        (None, Some(r)) => {
            s.cluster.release(&r.pool, &spec.host)?;
            tracing::info!(pool = %r.pool, cores = r.cores, "cluster: released pool cores");
            lock(slot).reserved = None;
        }
        _ => {}
    }
    Ok(())
}

fn agent(spec: &ClusterSpec, slot: &Mutex<Slot>, poke: &std::os::fd::OwnedFd, stop: &StopWatch) {
    let mut session: Option<Session> = None;
    let mut next = Instant::now();
    let mut poked = false;
    loop {
        if session.is_none() {
            match open(spec) {
                Ok(s) => session = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cluster: cannot reach the control plane");
                    let mut g = lock(slot);
                    g.connected = false;
                    g.error = Some(e.to_string());
                }
            }
        }
        if let Some(s) = &session
            && let Err(e) = round(spec, s, slot)
        {
            tracing::warn!(error = %e, "cluster: lost the control plane; reconnecting");
            let mut g = lock(slot);
            g.connected = false;
            g.error = Some(e.to_string());
            // Its lease, and what was reserved under it, are lost with the session.
            g.reserved = None;
            session = None;
        }
        // A round that a poke brought forward keeps the second it was waiting for.
        if !std::mem::take(&mut poked) {
            next += PUBLISH_EVERY;
            next = next.max(Instant::now());
        }
        // Until the next second, or a poke: then a round at once.
        match stop.wait_readable(poke, Some(next)) {
            Ok(Readiness::Ready) => {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(poke, &mut b);
                poked = true;
            }
            Ok(Readiness::TimedOut) => {}
            Ok(Readiness::Stopped) | Err(_) => return revoke(session),
        }
    }
}

/// Going away on purpose: the record (and any reservation) goes now, not when the lease runs
/// out.
fn revoke(session: Option<Session>) {
    if let Some(s) = session {
        use spillway_cluster::Kv;
        let _ = s.cluster.kv().revoke(s.lease);
    }
}
