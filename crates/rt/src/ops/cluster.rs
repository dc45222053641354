//! The DPU process's cluster agent (`[cluster]` in the testbed): a thread that keeps this host's
//! record in the cluster control plane (`spillway_cluster`) and brings back the cluster
//! baseline for URSched.
//!
//! The forwarding loop never waits on the network: once a second ([`ClusterAgent::exchange`],
//! from its publishing step) it leaves the newest record in a shared slot and reads the newest
//! baseline, both behind a mutex held for a copy. The thread does the rest, each request
//! bounded by the etcd client's timeout:
//!
//! - connect, take a lease of `lease_ttl`, and follow the baseline with a watch;
//! - a pool host (`cluster.pool_cores`) offers its cores under the lease;
//! - every second, renew the lease and publish the record left in the slot; while URSched
//!   wants cores it cannot find here (a fallback), reserve them on the pool host with most
//!   free, and release them once it no longer does;
//! - on any error, forget the connection and start again a second later (the record
//!   disappears from the cluster when the lease runs out, as a dead host's would);
//! - at stop, revoke the lease, so the record goes at once.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spillway_cluster::{Cluster, HostRecord, LeaseId, PlaneState, Store, TenantLoad};
use spillway_fabric::dpu::Phase;

use crate::ops::service::{StopSignal, StopWatch, stop_pair};
use crate::testbed::ClusterSpec;

/// How often the record is published and the lease renewed.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// What the loop and the thread share.
#[derive(Debug, Default)]
struct Slot {
    /// The newest record the loop left.
    record: Option<HostRecord>,
    /// The newest baseline the watch brought (normalised variance).
    baseline: Option<f64>,
    /// Cores URSched wants from a pool (its fallback), as the loop last said.
    want_remote: Option<u32>,
    /// The pool host and cores this host holds there.
    reserved: Option<(String, u32)>,
    /// Whether the thread holds a live lease and published at least once on it.
    connected: bool,
    /// Records published.
    published: u64,
    /// The last error, if the last attempt failed.
    error: Option<String>,
}

/// The agent: its thread, stopped and joined on drop.
#[derive(Debug)]
pub struct ClusterAgent {
    spec: ClusterSpec,
    slot: Arc<Mutex<Slot>>,
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
        let thread = {
            let (spec, slot) = (spec.clone(), Arc::clone(&slot));
            std::thread::Builder::new()
                .name("cluster-agent".into())
                .spawn(move || agent(&spec, &slot, &watch))?
        };
        Ok(ClusterAgent {
            spec: spec.clone(),
            slot,
            stop,
            thread: Some(thread),
        })
    }

    /// Leaves `record` to be published and the cores wanted from a pool (`None`: none), and
    /// returns the newest baseline (`None`: none yet, or the control plane is unreachable and
    /// the host judges its tenants alone).
    pub fn exchange(&self, record: HostRecord, want_remote: Option<u32>) -> Option<f64> {
        let mut s = lock(&self.slot);
        s.record = Some(record);
        s.want_remote = want_remote;
        if s.connected { s.baseline } else { None }
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
            "reserved": s.reserved.as_ref().map(|(pool, cores)| serde_json::json!({
                "pool": pool, "cores": cores,
            })),
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
    let (want, held) = {
        let g = lock(slot);
        (g.want_remote, g.reserved.clone())
    };
    match (want, held) {
        (Some(cores), None) => match s.cluster.reserve_anywhere(&spec.host, cores, s.lease)? {
            Some(pool) => {
                tracing::info!(pool = %pool, cores, "cluster: reserved pool cores");
                lock(slot).reserved = Some((pool, cores));
            }
            None => tracing::debug!(cores, "cluster: no pool host has room"),
        },
        (None, Some((pool, cores))) => {
            s.cluster.release(&pool, &spec.host)?;
            tracing::info!(pool = %pool, cores, "cluster: released pool cores");
            lock(slot).reserved = None;
        }
        _ => {}
    }
    Ok(())
}

fn agent(spec: &ClusterSpec, slot: &Mutex<Slot>, stop: &StopWatch) {
    let mut session: Option<Session> = None;
    let mut next = Instant::now();
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
        next += PUBLISH_EVERY;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        if stop.sleep_until(next).unwrap_or(true) {
            break;
        }
    }
    // Going away on purpose: the record goes now, not when the lease runs out.
    if let Some(s) = session {
        use spillway_cluster::Kv;
        let _ = s.cluster.kv().revoke(s.lease);
    }
}
