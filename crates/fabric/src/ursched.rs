//! URSched, the Unified Resource Scheduler: from DPU load, tenant traffic variance and the host's
//! idle isolatable cores it decides when to prepare, activate and release the spill plane, how
//! large the overflow quota is, and how many workers the plane runs. It decides; the
//! [`crate::dpu::DpuNode`] carries the decisions out. Every decision carries its reason.
//!
//! Inputs once per window ([`Load`]); variance samples once per variance window.
//!
//! - **Pressure**: fast-path or SoC utilisation above `pressure_util`, or any fast-path /
//!   slow-path drop, in N of the last M windows.
//! - **Noisy tenant**: per tenant, the squared coefficient of variation (variance / mean^2) of its
//!   packet rate over the last `variance_samples` variance windows; the cluster value is the same
//!   statistic of the cluster's total rate. Normalising by the mean makes a big steady tenant and
//!   a small steady tenant look alike, so only burstiness counts, not size; comparing with the
//!   aggregate (not the mean of the tenants) means a load change every tenant shares does not
//!   single out whichever tenant sampling noise puts on top. A tenant above `variance_factor` x
//!   the cluster value (and above `variance_floor`) in N of the last M variance windows prepares
//!   the plane (pre-warm: it goes to shadow mode and activates only under pressure). In a
//!   cluster the driver feeds the cluster's baseline ([`URSched::set_cluster_baseline`]: the
//!   average normalised variance of every host's tenants, from the control plane); a tenant is
//!   then compared with it instead of with this host's aggregate, and one tenant alone on a
//!   host can be noisy. [`URSched::tenant_loads`] is what this host publishes for it.
//! - **Prepare vs activate**: load above `prepare_util` (N of M windows) starts the plane in
//!   shadow mode; load above `pressure_util` activates it. With `prepare_util` below
//!   `pressure_util` a rising load finds the plane warm and activation costs only the redirect
//!   rules; by default both are 0.85 (the paper's cold start: plane start + rule injection).
//! - **Memory**: DPU memory utilisation above `mem_util` prepares the plane.
//! - **Release**: the whole load (DPU plus what the host carries) would fit the DPU under
//!   `release_util` for `release_windows` consecutive windows.
//! - **Quota**: fast-path pressure redirects every bucket (only new connections can move, and
//!   placement refills the fast path up to its target). SoC-only pressure grows the quota to the
//!   share that brings the SoC back under `pressure_util - 0.05` (its load is proportional to the
//!   share of new connections it keeps; a saturated SoC, which reads ~1 whatever the overload,
//!   halves the share it keeps), at least `quota_step` buckets per pressured window, while the
//!   plane has headroom (utilisation under `worker_add_util`, or a worker still to add); a plane
//!   that cannot grow gets no more than its measured capacity allows. The quota never shrinks
//!   while active: giving buckets back means handing their connections back, which is what a
//!   release does.
//! - **Workers**: plane utilisation above `worker_add_util` adds the workers that bring it back to
//!   `worker_add_util - 0.1` (at least one), up to the isolatable idle cores (host cores - tenant
//!   cores - reserve) and `workers_max`; for a plane on a remote pool host, up to the cores the
//!   pool granted instead.
//! - **Remote pool**: a reason to prepare with zero isolatable host cores wants the plane's
//!   initial workers from a remote pool ([`URSched::remote_wanted`]; the driver's cluster agent
//!   reserves them on a pool host). Until the driver reports a grant
//!   ([`URSched::set_remote_grant`]) that is a fallback, noted once: the plane is not started
//!   and the decision says why. With a grant of `g` cores the plane is prepared there
//!   ([`Decision::Prepare`] with `remote: true`, `min(workers_initial, g)` workers), and
//!   activated, sized and released by the same rules as a local one. The reservation is kept
//!   while the remote plane lives and until `release_windows` windows without a reason to
//!   prepare have passed with no plane.
//! - **Overflow comes home**: a remote plane is released when this host has had isolatable
//!   cores again for `release_windows` consecutive windows; if the pressure lasts, a local
//!   plane is prepared as for any idle host. A remote plane costs a network hop per packet and
//!   another host's cores, so it is only the stopgap.

use spillway_vswitch::TenantId;

use crate::params::{FabricParams, SchedParams};

/// What URSched sees once per window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Fast-path utilisation (work / capacity) over the window.
    pub hw_util: f64,
    /// SoC utilisation over the window.
    pub soc_util: f64,
    /// Fast-path and slow-path drops in the window.
    pub dpu_drops: u64,
    /// Hardware table occupancy in [0, 1].
    pub table_util: f64,
    /// DPU memory occupancy in [0, 1].
    pub mem_util: f64,
    /// Packets per second the host plane carried (steered to it) in the window.
    pub host_pps: f64,
    /// New connections per second the host plane opened in the window.
    pub host_cps: f64,
    /// New connections per second the DPU's SoC opened in the window.
    pub dpu_cps: f64,
    /// Spill-plane worker utilisation (last heartbeat).
    pub plane_util: f64,
    /// Workers the plane runs.
    pub workers: u32,
    /// Host cores the tenants use now.
    pub tenant_cores: u32,
}

/// A decision and its reason.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Start the plane and sync it in shadow mode.
    Prepare {
        /// Workers to start with.
        workers: u32,
        /// What triggered it.
        cause: Cause,
        /// Why.
        reason: String,
        /// Start it on the remote pool host that granted this host cores
        /// ([`URSched::set_remote_grant`]), not on this host's isolatable cores.
        remote: bool,
    },
    /// Install the redirect rules.
    Activate {
        /// Why.
        reason: String,
    },
    /// Redirect this many buckets (never fewer than now while active).
    Quota {
        /// Buckets redirected.
        buckets: u16,
        /// Why.
        reason: String,
    },
    /// Run this many workers.
    Workers {
        /// Target.
        workers: u32,
        /// Why.
        reason: String,
    },
    /// Hand everything back and stop the plane.
    Release {
        /// Why.
        reason: String,
    },
    /// Pressure, but no safe host capacity and no remote pool cores granted yet: stay on the
    /// DPU, and want cores from the pool ([`URSched::remote_wanted`]).
    Fallback {
        /// Why.
        reason: String,
    },
}

/// What made URSched prepare the plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// DPU load above `prepare_util`: activation follows as soon as the load passes
    /// `pressure_util`; this decision is the activation's trigger.
    Load,
    /// DPU memory above `mem_util` (pre-warm).
    Memory,
    /// A noisy tenant (pre-warm).
    Variance,
    /// An operator asked for it (`spillway ctl activate`): the decision is the trigger.
    Operator,
}

/// Where the plane is, as far as URSched's decisions go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaneView {
    /// No plane.
    Idle,
    /// Starting or syncing; `synced` once the bulk sync finished.
    Preparing {
        /// Bulk sync done.
        synced: bool,
        /// The plane runs on a remote pool host (its prepare said `remote: true`).
        remote: bool,
    },
    /// Redirect rules live.
    Active {
        /// The plane runs on a remote pool host.
        remote: bool,
    },
    /// Activating or releasing: no decisions (and the come-home count pauses).
    Busy,
}

/// N-of-M history of a condition, newest in bit 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct History(u64);

impl History {
    fn push(&mut self, v: bool, m: u32) {
        let mask = if m >= 64 { u64::MAX } else { (1u64 << m) - 1 };
        self.0 = ((self.0 << 1) | u64::from(v)) & mask;
    }
    fn count(self) -> u32 {
        self.0.count_ones()
    }
}

/// The scheduler.
#[derive(Clone, Debug)]
pub struct URSched {
    p: SchedParams,
    /// Fast-path utilisation one packet per second adds.
    hw_cost_s: f64,
    /// SoC utilisation one new connection per second adds.
    soc_cost_s: f64,
    host_cores: u32,
    reserve_cores: u32,
    workers_max: u32,
    workers_initial: u32,
    redirect_buckets: u16,
    pressure: History,
    warm: History,
    /// Windows since the quota last changed.
    since_quota: u32,
    calm_windows: u32,
    windows_without_pressure: u32,
    fallback_noted: bool,
    /// Cores wanted from a remote pool: set by a fallback (pressure with no isolatable host
    /// core), cleared after `release_windows` windows without a reason to prepare, or when
    /// the host's own cores serve again.
    remote_wanted: Option<u32>,
    /// Windows without a reason to prepare since the fallback (or the remote plane's end).
    remote_calm: u32,
    /// Cores a remote pool host granted this host (the driver's report), if any; never 0.
    remote_grant: Option<u32>,
    /// Consecutive windows with a remote plane and isolatable host cores (Busy windows pause
    /// the count): `release_windows` of them bring the overflow home.
    home_windows: u32,
    quota: u16,
    /// Per tenant (indexed by id; ids above `TENANTS_MAX` share the last slot): packets in the
    /// current variance window, and the last samples (pps).
    tenants: Vec<TenantSamples>,
    noisy: History,
    noisy_note: Option<String>,
    /// Per-tenant mean rate and cv^2 of the last variance window, reused: the window runs every
    /// 100 ms on the real-time driver's forwarding thread, which must not allocate in steady
    /// state.
    cvs: Vec<TenantLoad>,
    cluster: TenantSamples,
    /// The cluster's baseline cv^2 from the control plane, when the driver has one.
    cluster_baseline: Option<f64>,
}

/// One tenant's load over the last `variance_samples` variance windows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantLoad {
    /// The tenant.
    pub tenant: TenantId,
    /// Mean packet rate, packets/s.
    pub mean_pps: f64,
    /// Squared coefficient of variation of the rate (variance / mean^2).
    pub cv2: f64,
}

/// Tenants tracked individually by the variance trigger.
pub const TENANTS_MAX: usize = 65_536;

/// Squared coefficient of variation of `k` samples; `None` until there are `k`, or for a zero
/// mean.
fn cv2(samples: &[f64], k: usize) -> Option<f64> {
    if samples.len() < k {
        return None;
    }
    let mean = samples.iter().sum::<f64>() / k as f64;
    if mean <= 0.0 {
        return None;
    }
    let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / k as f64;
    Some(var / (mean * mean))
}

#[derive(Clone, Debug, Default)]
struct TenantSamples {
    seen: bool,
    packets: u64,
    samples: Vec<f64>,
    next: usize,
}

impl URSched {
    /// A scheduler for the fabric `f`.
    pub fn new(f: &FabricParams) -> URSched {
        let host = &f.host;
        URSched {
            p: f.sched.clone(),
            hw_cost_s: 1.0 / f.dpu.hw_pps_limit,
            soc_cost_s: f.dpu.soc_new_conn_cost.as_secs_f64() / f64::from(f.dpu.soc_cores),
            host_cores: host.cores,
            reserve_cores: host.reserve_cores,
            workers_max: host.workers_max,
            workers_initial: host.workers_initial,
            redirect_buckets: f.dpu.redirect_buckets,
            pressure: History::default(),
            warm: History::default(),
            since_quota: 0,
            calm_windows: 0,
            windows_without_pressure: 0,
            fallback_noted: false,
            remote_wanted: None,
            remote_calm: 0,
            remote_grant: None,
            home_windows: 0,
            quota: 0,
            tenants: Vec::new(),
            noisy: History::default(),
            noisy_note: None,
            cvs: Vec::new(),
            cluster: TenantSamples::default(),
            cluster_baseline: None,
        }
    }

    /// The cluster's baseline cv^2 (the control plane's), or `None` to compare with this
    /// host's aggregate as a lone host does. A value that is not a finite number >= 0 is
    /// `None`.
    pub fn set_cluster_baseline(&mut self, cv2: Option<f64>) {
        self.cluster_baseline = cv2.filter(|v| v.is_finite() && *v >= 0.0);
    }

    /// The cluster baseline in use, if any.
    pub fn cluster_baseline(&self) -> Option<f64> {
        self.cluster_baseline
    }

    /// Host cores wanted from a remote pool, while a fallback or a remote plane lasts: what
    /// the plane would have started with here. Set by a reason to prepare with no isolatable
    /// host core; kept while a plane runs on the pool (whatever its phase); cleared by a local
    /// prepare, or after `release_windows` windows with no plane and no reason to prepare.
    /// The driver's cluster agent reserves them on a pool host and releases them when this
    /// goes back to `None`.
    pub fn remote_wanted(&self) -> Option<u32> {
        self.remote_wanted
    }

    /// The driver's report of the cores a remote pool host has granted this host (its
    /// reservation), or `None`. A grant of 0 is none. With a grant, a reason to prepare with
    /// no isolatable host core prepares a plane on the pool instead of falling back; a remote
    /// plane's worker count is bounded by it.
    pub fn set_remote_grant(&mut self, cores: Option<u32>) {
        self.remote_grant = cores.filter(|&g| g > 0);
    }

    /// The remote pool's grant in use, if any.
    pub fn remote_grant(&self) -> Option<u32> {
        self.remote_grant
    }

    /// Every tenant's load as of the last variance window (tenants with a full set of samples
    /// and traffic), by tenant id: what the host publishes to the cluster.
    pub fn tenant_loads(&self) -> &[TenantLoad] {
        &self.cvs
    }

    /// The thresholds.
    pub fn params(&self) -> &SchedParams {
        &self.p
    }

    /// Counts `packets` offered by `tenant` (for the variance trigger).
    #[inline]
    pub fn count_tenant(&mut self, tenant: TenantId, packets: u64) {
        let i = (tenant.0 as usize).min(TENANTS_MAX - 1);
        if i >= self.tenants.len() {
            self.tenants.resize_with(i + 1, TenantSamples::default);
        }
        let t = &mut self.tenants[i];
        t.packets += packets;
        t.seen = true;
    }

    /// Closes a variance window of length `secs`: one rate sample per tenant and one of the
    /// whole cluster, then the noisy test of each tenant against the cluster.
    pub fn variance_window(&mut self, secs: f64) {
        let k = self.p.variance_samples as usize;
        let total: u64 = self.tenants.iter().map(|t| t.packets).sum();
        let cluster = &mut self.cluster;
        let rate = total as f64 / secs;
        if cluster.samples.len() < k {
            cluster.samples.push(rate);
        } else {
            cluster.samples[cluster.next] = rate;
        }
        cluster.next = (cluster.next + 1) % k;
        let cluster_cv2 = cv2(&cluster.samples, k);
        let mut cvs = core::mem::take(&mut self.cvs);
        cvs.clear();
        for (i, t) in self.tenants.iter_mut().enumerate() {
            if !t.seen {
                continue;
            }
            let id = TenantId(i as u32);
            let rate = t.packets as f64 / secs;
            t.packets = 0;
            if t.samples.len() < k {
                t.samples.push(rate);
            } else {
                t.samples[t.next] = rate;
            }
            t.next = (t.next + 1) % k;
            if t.samples.len() == k {
                let mean = t.samples.iter().sum::<f64>() / k as f64;
                if mean > 0.0 {
                    let var = t
                        .samples
                        .iter()
                        .map(|x| (x - mean) * (x - mean))
                        .sum::<f64>()
                        / k as f64;
                    cvs.push(TenantLoad {
                        tenant: id,
                        mean_pps: mean,
                        cv2: var / (mean * mean),
                    });
                }
            }
        }
        // The cluster's baseline when the control plane gives one (a lone tenant can then be
        // noisy); else this host's aggregate, which needs two tenants to compare.
        let against = match self.cluster_baseline {
            Some(b) if !cvs.is_empty() => Some((b, "cluster baseline")),
            _ if cvs.len() >= 2 => cluster_cv2.map(|c| (c, "host aggregate")),
            _ => None,
        };
        let noisy = match against {
            Some((cluster, what)) => {
                // The noisiest tenant; ties go to the lowest id (the first maximum).
                let (id, v) = cvs.iter().fold((TenantId(0), f64::MIN), |a, b| {
                    if b.cv2 > a.1 { (b.tenant, b.cv2) } else { a }
                });
                // The floor keeps a cluster of perfectly steady tenants (cv^2 near zero) from
                // calling its least steady member noisy.
                if v > self.p.variance_floor && v > self.p.variance_factor * cluster {
                    self.noisy_note = Some(format!(
                        "{id} variance (cv^2) {v:.3} > {:.2} x {what} {cluster:.3}",
                        self.p.variance_factor
                    ));
                    true
                } else {
                    false
                }
            }
            _ => false,
        };
        self.cvs = cvs;
        self.noisy.push(noisy, self.p.history_windows);
    }

    /// The quota that brings the SoC from `soc_util` back to `release_util`-side safety: the
    /// SoC's load is proportional to the share of new connections it keeps, so keeping
    /// `(1 - f) * target / util` of it lands at the target (`pressure_util - 0.05`). At least
    /// `quota_step` more than now.
    fn soc_quota(&self, soc_util: f64) -> u16 {
        let n = f64::from(self.redirect_buckets);
        let f = f64::from(self.quota) / n;
        let target = (self.p.pressure_util - 0.05).max(0.05);
        // A saturated SoC's utilisation reads ~1 whatever the overload, so the proportional
        // step would under-correct: then halve the share the DPU keeps.
        let keep = if soc_util > 0.95 {
            (1.0 - f) / 2.0
        } else {
            (1.0 - f) * (target / soc_util.max(target))
        };
        let q = ((1.0 - keep) * n).ceil() as u16;
        q.max(self.quota + self.p.quota_step)
            .min(self.redirect_buckets)
    }

    /// The most buckets a plane that cannot grow any more can take: its measured capacity
    /// (connections/s it carried over its utilisation) up to `worker_add_util`, as a share of
    /// all new connections. No cap while the plane can still add workers or is barely loaded
    /// (its capacity is not measurable yet).
    fn plane_quota_cap(&self, load: &Load, cores: u32) -> u16 {
        let total = load.host_cps + load.dpu_cps;
        if load.workers < cores || load.plane_util < 0.05 || total <= 0.0 {
            return self.redirect_buckets;
        }
        let capacity = load.host_cps / load.plane_util;
        let share = (capacity * self.p.worker_add_util / total).clamp(0.0, 1.0);
        (share * f64::from(self.redirect_buckets)).floor() as u16
    }

    /// Host cores a plane could take with `tenant_cores` busy: the host's, less the tenants'
    /// and the reserve, at most `workers_max`.
    pub fn isolatable(&self, tenant_cores: u32) -> u32 {
        self.host_cores
            .saturating_sub(tenant_cores)
            .saturating_sub(self.reserve_cores)
            .min(self.workers_max)
    }

    /// Decides for one window. `plane` is where the lifecycle is.
    pub fn window(&mut self, load: &Load, plane: PlaneView, out: &mut Vec<Decision>) {
        let p = &self.p;
        let hw_hot = load.hw_util > p.pressure_util;
        let soc_hot = load.soc_util > p.pressure_util;
        let pressured = hw_hot || soc_hot || load.dpu_drops > 0;
        self.pressure.push(pressured, p.history_windows);
        let warm = load.hw_util > p.prepare_util || load.soc_util > p.prepare_util || pressured;
        self.warm.push(warm, p.history_windows);
        let sustained = self.pressure.count() >= p.pressure_windows;
        let warm_sustained = self.warm.count() >= p.pressure_windows;
        if warm {
            self.windows_without_pressure = 0;
        } else {
            self.windows_without_pressure = self.windows_without_pressure.saturating_add(1);
        }
        let why = |threshold: f64, count: u32| {
            let (m, v) = if hw_hot || load.hw_util >= load.soc_util {
                ("dpu.hw.util", load.hw_util)
            } else {
                ("dpu.soc.util", load.soc_util)
            };
            format!(
                "{m} {v:.2} > {threshold:.2} (or drops) in {count} of {} windows",
                p.history_windows
            )
        };
        let why_pressure = || why(p.pressure_util, self.pressure.count());
        let cores_here = self.isolatable(load.tenant_cores);
        match plane {
            PlaneView::Preparing { remote: true, .. } | PlaneView::Active { remote: true } => {
                // A plane on the pool needs its reservation for as long as it lives, whatever
                // happened in Idle before it (an operator's prepare cannot be remote, so this
                // is only ever URSched's own plane).
                self.remote_wanted.get_or_insert(self.workers_initial);
                self.remote_calm = 0;
                if cores_here > 0 {
                    self.home_windows = self.home_windows.saturating_add(1);
                } else {
                    self.home_windows = 0;
                }
            }
            PlaneView::Idle
            | PlaneView::Preparing { remote: false, .. }
            | PlaneView::Active { remote: false } => self.home_windows = 0,
            PlaneView::Busy => {}
        }
        // Overflow comes home: the host has cores for a plane again, so the remote one (a
        // network hop per packet, another host's cores) is released by the usual release,
        // which hands every connection back to the DPU; if the pressure lasts, the Idle rules
        // below prepare a local plane a few windows later. Those windows are a gap in which
        // the DPU carries the overflow alone; handing the remote plane's connections straight
        // to a warm local plane (an upgrade-style flip across hosts) would close it, and is
        // not built. A plane that is not synced yet waits: a release is only defined for a
        // synced shadow plane or an active one.
        let releasable = matches!(
            plane,
            PlaneView::Preparing {
                synced: true,
                remote: true
            } | PlaneView::Active { remote: true }
        );
        if releasable && self.home_windows >= p.release_windows {
            self.home_windows = 0;
            self.calm_windows = 0;
            out.push(Decision::Release {
                reason: format!(
                    "{cores_here} isolatable host cores again for {} windows: overflow comes home from the remote pool",
                    p.release_windows
                ),
            });
            return;
        }
        match plane {
            PlaneView::Idle => {
                self.quota = 0;
                let noisy = self.noisy.count() >= p.variance_windows;
                let mem = load.mem_util > p.mem_util;
                let reason = if warm_sustained {
                    Some((Cause::Load, why(p.prepare_util, self.warm.count())))
                } else if mem {
                    Some((
                        Cause::Memory,
                        format!("dpu.mem.util {:.2} > {:.2}", load.mem_util, p.mem_util),
                    ))
                } else if noisy {
                    Some((
                        Cause::Variance,
                        format!(
                            "{} in {} of {} variance windows",
                            self.noisy_note.as_deref().unwrap_or("noisy tenant"),
                            self.noisy.count(),
                            p.history_windows
                        ),
                    ))
                } else {
                    None
                };
                if reason.is_none() && self.remote_wanted.is_some() {
                    self.remote_calm += 1;
                    if self.remote_calm >= p.release_windows {
                        self.remote_wanted = None;
                        self.fallback_noted = false;
                    }
                }
                if let Some((cause, reason)) = reason {
                    let cores = cores_here;
                    self.windows_without_pressure = 0;
                    self.remote_calm = 0;
                    if cores == 0 {
                        // Wanted from the pool whether or not it has granted them yet: the
                        // reservation is what a grant (and a remote plane) stands on.
                        self.remote_wanted = Some(self.workers_initial);
                        let none_here = format!(
                            "0 isolatable host cores ({} cores - {} tenant - {} reserve)",
                            self.host_cores, load.tenant_cores, self.reserve_cores
                        );
                        match self.remote_grant {
                            Some(granted) => {
                                // A later fallback (the grant gone) is news again.
                                self.fallback_noted = false;
                                out.push(Decision::Prepare {
                                    workers: self.workers_initial.min(granted),
                                    cause,
                                    reason: format!(
                                        "{reason}, to {granted} remote pool cores because {none_here}"
                                    ),
                                    remote: true,
                                });
                            }
                            None if !self.fallback_noted => {
                                self.fallback_noted = true;
                                out.push(Decision::Fallback {
                                    reason: format!("{reason}, but {none_here}"),
                                });
                            }
                            None => {}
                        }
                    } else {
                        self.fallback_noted = false;
                        self.remote_wanted = None;
                        out.push(Decision::Prepare {
                            workers: self.workers_initial.min(cores),
                            cause,
                            reason,
                            remote: false,
                        });
                    }
                }
            }
            PlaneView::Preparing { synced, .. } => {
                if synced && sustained {
                    out.push(Decision::Activate {
                        reason: why_pressure(),
                    });
                    let buckets = if hw_hot || load.hw_util >= load.soc_util {
                        self.redirect_buckets
                    } else {
                        self.soc_quota(load.soc_util)
                    };
                    self.quota = buckets;
                    self.since_quota = 0;
                    out.push(Decision::Quota {
                        buckets,
                        reason: format!(
                            "initial quota: {}",
                            if buckets == self.redirect_buckets {
                                "fast path under pressure, all new connections to the host"
                            } else {
                                "slow path under pressure"
                            }
                        ),
                    });
                } else if synced
                    && u64::from(self.windows_without_pressure) * (p.window.as_nanos() as u64)
                        >= p.shadow_idle.as_nanos() as u64
                {
                    out.push(Decision::Release {
                        reason: format!(
                            "shadow plane idle: no pressure for {} windows",
                            self.windows_without_pressure
                        ),
                    });
                }
            }
            PlaneView::Active { remote } => {
                // The cores the plane may run on: this host's isolatable ones, or for a plane
                // on the pool the pool's grant (with no grant reported, the workers it runs:
                // neither grown nor shrunk on a missing report).
                let (cores, what) = if remote {
                    let granted = self.remote_grant.unwrap_or(load.workers);
                    (granted.min(self.workers_max), "remote pool")
                } else {
                    (cores_here, "isolatable")
                };
                // The plane can take more only while it has headroom or can still grow: a quota
                // beyond its capacity would move the loss from the SoC to the plane.
                let plane_room = load.plane_util < p.worker_add_util || load.workers < cores;
                // After a change, wait until a whole window has been measured under the new
                // quota: the window that ends right after a change still shows the old load.
                self.since_quota = self.since_quota.saturating_add(1);
                let settled = self.since_quota > 1;
                if pressured
                    && self.quota < self.redirect_buckets
                    && (hw_hot || (plane_room && settled))
                {
                    self.since_quota = 0;
                    let q = if hw_hot {
                        self.redirect_buckets
                    } else {
                        self.soc_quota(load.soc_util)
                            .min(self.plane_quota_cap(load, cores))
                            .max(self.quota)
                    };
                    if q > self.quota {
                        out.push(Decision::Quota {
                            buckets: q,
                            reason: why_pressure(),
                        });
                        self.quota = q;
                    }
                }
                if load.plane_util > p.worker_add_util && load.workers < cores {
                    // Enough workers to bring the plane back to 10 points under the threshold
                    // (its load spreads evenly over them), at least one more.
                    let target = (p.worker_add_util - 0.1).max(0.1);
                    let want = (f64::from(load.workers) * load.plane_util / target).ceil() as u32;
                    out.push(Decision::Workers {
                        workers: want.max(load.workers + 1).min(cores),
                        reason: format!(
                            "spill.util {:.2} > {:.2}, {cores} {what} cores",
                            load.plane_util, p.worker_add_util
                        ),
                    });
                } else if load.workers > cores {
                    out.push(Decision::Workers {
                        workers: cores.max(1),
                        reason: if remote {
                            format!("the remote pool now grants {cores} cores")
                        } else {
                            format!(
                                "isolation: tenants now use {} cores, {cores} isolatable",
                                load.tenant_cores
                            )
                        },
                    });
                }
                // Would everything fit on the DPU? The host's packets on the fast path and its
                // new connections on the SoC.
                let fits_hw = load.hw_util + load.host_pps * self.hw_cost_s < p.release_util;
                let fits_soc = load.soc_util + load.host_cps * self.soc_cost_s < p.release_util;
                if fits_hw && fits_soc && !pressured {
                    self.calm_windows += 1;
                } else {
                    self.calm_windows = 0;
                }
                if self.calm_windows >= p.release_windows {
                    self.calm_windows = 0;
                    out.push(Decision::Release {
                        reason: format!(
                            "pressure subsided: dpu.hw.util {:.2} + host {:.2} Mpps and dpu.soc.util {:.2} + host {:.0} cps fit under {:.2} for {} windows",
                            load.hw_util,
                            load.host_pps / 1e6,
                            load.soc_util,
                            load.host_cps,
                            p.release_util,
                            p.release_windows
                        ),
                    });
                }
            }
            PlaneView::Busy => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One bursty tenant alone on a host: against the host aggregate nothing can single it
    /// out; against a calm cluster baseline it prepares the plane, and the reason says so;
    /// against a baseline as bursty as it, it does not. Its published load is its own.
    #[test]
    fn a_lone_tenant_is_judged_against_the_cluster_baseline() {
        let f = FabricParams::default();
        let run = |baseline: Option<f64>| {
            let mut s = URSched::new(&f);
            s.set_cluster_baseline(baseline);
            let mut out = Vec::new();
            for w in 0..40u64 {
                // 1,000 or 9,000 packets a window: mean 5,000, cv^2 0.64.
                s.count_tenant(TenantId(7), if w % 2 == 0 { 1_000 } else { 9_000 });
                s.variance_window(1.0);
                s.window(&Load::default(), PlaneView::Idle, &mut out);
            }
            (s, out)
        };
        let (lone, out) = run(None);
        assert!(out.is_empty(), "{out:?}");
        let loads = lone.tenant_loads();
        assert_eq!(loads.len(), 1);
        assert_eq!(loads[0].tenant, TenantId(7));
        assert!((loads[0].mean_pps - 5_000.0).abs() < 1e-9);
        assert!((loads[0].cv2 - 0.64).abs() < 1e-9);
        let (_, out) = run(Some(0.1));
        let Some(Decision::Prepare { cause, reason, .. }) = out.first() else {
            panic!("expected a prepare: {out:?}");
        };
        assert_eq!(*cause, Cause::Variance);
        assert!(reason.contains("cluster baseline 0.100"), "{reason}");
        let (_, out) = run(Some(0.6));
        assert!(out.is_empty(), "0.64 is not 1.25 x 0.6: {out:?}");
        // A baseline that is not a number is none.
        let mut s = URSched::new(&f);
        s.set_cluster_baseline(Some(f64::NAN));
        assert_eq!(s.cluster_baseline(), None);
    }

    /// Pressure on a host with no isolatable core: a fallback, and the cores wanted from a
    /// remote pool until `release_windows` calm windows have passed.
    #[test]
    fn a_fallback_wants_remote_cores_until_the_pressure_is_gone() {
        let f = FabricParams::default();
        let mut s = URSched::new(&f);
        let full = f.host.cores - f.host.reserve_cores;
        let hot = Load {
            hw_util: 0.99,
            tenant_cores: full,
            ..Load::default()
        };
        let calm = Load {
            tenant_cores: full,
            ..Load::default()
        };
        let mut out = Vec::new();
        for _ in 0..f.sched.history_windows {
            s.window(&hot, PlaneView::Idle, &mut out);
        }
        assert!(
            out.iter().any(|d| matches!(d, Decision::Fallback { .. })),
            "{out:?}"
        );
        assert_eq!(s.remote_wanted(), Some(f.host.workers_initial));
        // The pressure leaves the N-of-M history first, then `release_windows` calm windows.
        let mut calm_windows = 0;
        while s.remote_wanted().is_some() {
            s.window(&calm, PlaneView::Idle, &mut out);
            calm_windows += 1;
            assert!(calm_windows <= f.sched.history_windows + f.sched.release_windows);
        }
        assert!(calm_windows >= f.sched.release_windows, "{calm_windows}");
        // Cores of its own again: a plane here, nothing wanted remotely.
        let own = Load {
            hw_util: 0.99,
            ..Load::default()
        };
        out.clear();
        for _ in 0..f.sched.history_windows {
            s.window(&own, PlaneView::Idle, &mut out);
        }
        assert!(
            out.iter().any(|d| matches!(d, Decision::Prepare { .. })),
            "{out:?}"
        );
        assert_eq!(s.remote_wanted(), None);
    }

    /// A host whose tenants take every core but the reserve, under pressure or calm.
    fn full_host(f: &FabricParams, hw_util: f64) -> Load {
        Load {
            hw_util,
            tenant_cores: f.host.cores - f.host.reserve_cores,
            ..Load::default()
        }
    }

    /// The decisions of `windows` windows of `load` with the plane in `plane`.
    fn run(s: &mut URSched, load: &Load, plane: PlaneView, windows: u32) -> Vec<Decision> {
        let mut out = Vec::new();
        for _ in 0..windows {
            s.window(load, plane, &mut out);
        }
        out
    }

    fn releases(out: &[Decision]) -> Vec<&str> {
        out.iter()
            .filter_map(|d| match d {
                Decision::Release { reason } => Some(reason.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Pressure with no isolatable core: with a pool grant, a plane on the pool with at most
    /// the granted workers and no fallback; with none (or a grant of 0), the fallback as
    /// before, noted once.
    #[test]
    fn a_pool_grant_prepares_a_remote_plane_instead_of_falling_back() {
        let f = FabricParams::default();
        let hot = full_host(&f, 0.99);
        for (grant, workers) in [(1, 1), (5, f.host.workers_initial)] {
            let mut s = URSched::new(&f);
            s.set_remote_grant(Some(grant));
            let out = run(&mut s, &hot, PlaneView::Idle, f.sched.history_windows);
            assert!(
                !out.iter().any(|d| matches!(d, Decision::Fallback { .. })),
                "{out:?}"
            );
            let Some(Decision::Prepare {
                workers: w,
                cause,
                reason,
                remote,
            }) = out.first()
            else {
                panic!("expected a prepare: {out:?}");
            };
            assert_eq!((*w, *cause, *remote), (workers, Cause::Load, true));
            assert!(
                reason.contains(&format!(
                    "to {grant} remote pool cores because 0 isolatable host cores (64 cores - 62 tenant - 2 reserve)"
                )),
                "{reason}"
            );
            assert_eq!(s.remote_wanted(), Some(f.host.workers_initial));
        }
        for grant in [None, Some(0)] {
            let mut s = URSched::new(&f);
            s.set_remote_grant(grant);
            assert_eq!(s.remote_grant(), None);
            let out = run(&mut s, &hot, PlaneView::Idle, 2 * f.sched.history_windows);
            assert_eq!(out.len(), 1, "{out:?}");
            assert!(matches!(out[0], Decision::Fallback { .. }), "{out:?}");
            assert_eq!(s.remote_wanted(), Some(f.host.workers_initial));
        }
        // The grant arrives while the fallback lasts: the next window prepares on the pool.
        let mut s = URSched::new(&f);
        let out = run(&mut s, &hot, PlaneView::Idle, f.sched.history_windows);
        assert!(matches!(out[..], [Decision::Fallback { .. }]), "{out:?}");
        s.set_remote_grant(Some(2));
        let out = run(&mut s, &hot, PlaneView::Idle, 1);
        assert!(
            matches!(
                out[..],
                [Decision::Prepare {
                    remote: true,
                    workers: 2,
                    ..
                }]
            ),
            "{out:?}"
        );
    }

    /// The cores stay wanted from the pool while the remote plane lives, whatever its phase
    /// and load, through its release, and until `release_windows` calm windows with no plane.
    #[test]
    fn remote_cores_stay_wanted_while_the_remote_plane_lives_and_until_the_idle_countdown() {
        let f = FabricParams::default();
        let (hot, calm) = (full_host(&f, 0.99), full_host(&f, 0.0));
        let mut s = URSched::new(&f);
        s.set_remote_grant(Some(2));
        let out = run(&mut s, &hot, PlaneView::Idle, f.sched.pressure_windows);
        assert!(
            matches!(out[..], [Decision::Prepare { remote: true, .. }]),
            "{out:?}"
        );
        let wanted = Some(f.host.workers_initial);
        let long = 3 * f.sched.release_windows;
        for plane in [
            PlaneView::Preparing {
                synced: false,
                remote: true,
            },
            PlaneView::Preparing {
                synced: true,
                remote: true,
            },
            PlaneView::Busy,
            PlaneView::Active { remote: true },
        ] {
            for _ in 0..long {
                let out = run(&mut s, &hot, plane, 1);
                assert!(releases(&out).is_empty(), "{plane:?}: {out:?}");
                assert_eq!(s.remote_wanted(), wanted, "{plane:?}");
            }
        }
        // The pressure subsides: the usual release, the reservation kept.
        let mut windows = 0;
        loop {
            windows += 1;
            assert!(windows <= long, "no release");
            let out = run(&mut s, &calm, PlaneView::Active { remote: true }, 1);
            assert_eq!(s.remote_wanted(), wanted);
            if let [reason] = releases(&out)[..] {
                assert!(reason.starts_with("pressure subsided"), "{reason}");
                break;
            }
        }
        run(&mut s, &calm, PlaneView::Busy, 5);
        assert_eq!(s.remote_wanted(), wanted);
        // No plane, no reason to prepare: `release_windows` windows, then nothing wanted.
        for _ in 1..f.sched.release_windows {
            run(&mut s, &calm, PlaneView::Idle, 1);
            assert_eq!(s.remote_wanted(), wanted);
        }
        run(&mut s, &calm, PlaneView::Idle, 1);
        assert_eq!(s.remote_wanted(), None);
    }

    /// Isolatable host cores for `release_windows` consecutive windows release a remote plane
    /// (pressure or not), and say why; a window without resets the count; a plane not synced
    /// yet waits. Then a local plane follows if the pressure lasts, and nothing is wanted from
    /// the pool. A local plane is never released by this rule.
    #[test]
    fn isolatable_cores_again_bring_a_remote_plane_home() {
        let f = FabricParams::default();
        let n = f.sched.release_windows;
        let full = full_host(&f, 0.99);
        // Tenants leave 64 - 40 - 2 = 22 cores, at most `workers_max` (16) for a plane.
        let freed = Load {
            tenant_cores: 40,
            ..full
        };
        let active = PlaneView::Active { remote: true };
        let mut s = URSched::new(&f);
        s.set_remote_grant(Some(2));
        run(&mut s, &full, PlaneView::Idle, f.sched.history_windows);
        assert!(releases(&run(&mut s, &freed, active, n - 1)).is_empty());
        assert!(releases(&run(&mut s, &full, active, 1)).is_empty());
        assert!(releases(&run(&mut s, &freed, active, n - 1)).is_empty());
        let out = run(&mut s, &freed, active, 1);
        assert_eq!(
            releases(&out),
            [format!(
                "16 isolatable host cores again for {n} windows: overflow comes home from the remote pool"
            )],
            "{out:?}"
        );
        assert_eq!(
            out.len(),
            1,
            "no other decision for a plane going home: {out:?}"
        );
        assert_eq!(s.remote_wanted(), Some(f.host.workers_initial));
        // Still under pressure once it is gone: a local plane, and the pool's cores go back.
        run(&mut s, &freed, PlaneView::Busy, 3);
        let out = run(&mut s, &freed, PlaneView::Idle, 1);
        assert!(
            matches!(
                out[..],
                [Decision::Prepare {
                    remote: false,
                    workers: 2,
                    ..
                }]
            ),
            "{out:?}"
        );
        assert_eq!(s.remote_wanted(), None);

        // A remote plane still syncing waits for its sync, then goes home at once.
        let mut s = URSched::new(&f);
        s.set_remote_grant(Some(2));
        run(&mut s, &full, PlaneView::Idle, f.sched.history_windows);
        let unsynced = PlaneView::Preparing {
            synced: false,
            remote: true,
        };
        assert!(releases(&run(&mut s, &freed, unsynced, 2 * n)).is_empty());
        let synced = PlaneView::Preparing {
            synced: true,
            remote: true,
        };
        let out = run(&mut s, &freed, synced, 1);
        assert!(
            matches!(releases(&out)[..], [r] if r.contains("overflow comes home")),
            "{out:?}"
        );

        // A local plane with cores to spare stays, shadow or active.
        let mut s = URSched::new(&f);
        for plane in [
            PlaneView::Preparing {
                synced: true,
                remote: false,
            },
            PlaneView::Active { remote: false },
        ] {
            let out = run(&mut s, &freed, plane, 3 * n);
            assert!(releases(&out).is_empty(), "{plane:?}: {out:?}");
        }
    }

    /// A remote plane's workers are bounded by the pool's grant, not by this host's cores (it
    /// has none): it grows up to the grant and shrinks to a smaller one; with no grant
    /// reported it is left as it is.
    #[test]
    fn a_remote_plane_is_sized_by_the_pool_grant() {
        let f = FabricParams::default();
        let busy = Load {
            plane_util: 0.95,
            workers: 2,
            ..full_host(&f, 0.5)
        };
        let active = PlaneView::Active { remote: true };
        let workers = |out: &[Decision]| -> Vec<(u32, String)> {
            out.iter()
                .filter_map(|d| match d {
                    Decision::Workers { workers, reason } => Some((*workers, reason.clone())),
                    _ => None,
                })
                .collect()
        };
        let mut s = URSched::new(&f);
        s.set_remote_grant(Some(3));
        let out = workers(&run(&mut s, &busy, active, 1));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 3);
        assert!(out[0].1.ends_with("3 remote pool cores"), "{}", out[0].1);
        s.set_remote_grant(Some(1));
        let calm = Load {
            plane_util: 0.1,
            ..busy
        };
        let out = workers(&run(&mut s, &calm, active, 1));
        assert_eq!(out, [(1, "the remote pool now grants 1 cores".to_string())]);
        s.set_remote_grant(None);
        assert!(workers(&run(&mut s, &busy, active, 1)).is_empty());
        assert!(workers(&run(&mut s, &calm, active, 1)).is_empty());
        // The same plane on this host, with no isolatable core, is cut to one worker.
        let out = workers(&run(&mut s, &calm, PlaneView::Active { remote: false }, 1));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 1);
    }
}
