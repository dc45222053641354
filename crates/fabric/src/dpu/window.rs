//! The DPU's measurement windows: every `sched.window` the node closes a window, turns what it
//! counted into a [`Load`] for URSched, and says what the recall headroom of the next window
//! is (the headroom itself is a budget of the fast path, kept with the DPU's resources); every
//! `sched.variance_window` URSched rolls its per-tenant variance; every
//! `placement.rebalance_period` the plane gets the recalled entries' rates.
//!
//! This object owns the clocks of those periods, the counter values at the last window's edge
//! (a window's figures are differences), the last [`Load`], and URSched itself. What a window *does* (fail open on a
//! silent plane, shed, apply URSched's decisions) is the node's.

use std::time::Duration;

use spillway_vswitch::{Instant, TenantId};

use crate::params::FabricParams;
use crate::ursched::{Decision, Load, PlaneView, URSched};

/// Cumulative counts a window's rates are differences of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Fast-path and slow-path drops.
    pub drops: u64,
    /// Packets steered to the plane.
    pub steered: u64,
    /// New connections steered to the plane.
    pub steered_new: u64,
    /// Connections opened on the SoC.
    pub soc_new: u64,
}

impl Totals {
    /// Adds `other`'s counts (another shard's) to these.
    pub fn add(&mut self, other: &Totals) {
        self.drops += other.drops;
        self.steered += other.steered;
        self.steered_new += other.steered_new;
        self.soc_new += other.soc_new;
    }
}

/// Utilisations measured at a window's edge (busy time over elapsed time since the last one;
/// the table and memory as they are now).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Utils {
    /// The fast path.
    pub hw: f64,
    /// The SoC.
    pub soc: f64,
    /// The hardware table.
    pub table: f64,
    /// Memory.
    pub mem: f64,
}

/// The measurement windows. See the module doc.
#[derive(Debug)]
pub(crate) struct Windows {
    sched: URSched,
    decisions: Vec<Decision>,
    window: Duration,
    variance_window: Duration,
    rebalance_period: Duration,
    next_window: Instant,
    next_variance: Instant,
    next_stats: Instant,
    base: Totals,
    last_load: Load,
    tenant_cores: u32,
}

impl Windows {
    pub(crate) fn new(f: &FabricParams) -> Windows {
        Windows {
            sched: URSched::new(f),
            decisions: Vec::new(),
            window: f.sched.window,
            variance_window: f.sched.variance_window,
            rebalance_period: f.placement.rebalance_period,
            next_window: Instant::ZERO + f.sched.window,
            next_variance: Instant::ZERO + f.sched.variance_window,
            next_stats: Instant::ZERO + f.placement.rebalance_period,
            base: Totals::default(),
            last_load: Load::default(),
            tenant_cores: f.host.tenant_cores,
        }
    }

    /// Counts a tenant's packets for URSched's variance.
    pub(crate) fn count_tenant(&mut self, tenant: TenantId, packets: u64) {
        self.sched.count_tenant(tenant, packets);
    }

    /// URSched's scheduler.
    pub(crate) fn sched(&self) -> &URSched {
        &self.sched
    }

    /// Cores wanted from a remote pool (URSched's fallback).
    pub(crate) fn remote_wanted(&self) -> Option<u32> {
        self.sched.remote_wanted()
    }

    /// Host cores a plane could take now (URSched's rule, with the driver's tenant cores).
    pub(crate) fn isolatable_cores(&self) -> u32 {
        self.sched.isolatable(self.tenant_cores)
    }

    /// URSched's scheduler, to feed.
    pub(crate) fn sched_mut(&mut self) -> &mut URSched {
        &mut self.sched
    }

    /// The driver's report of the host cores the tenants use.
    pub(crate) fn set_tenant_cores(&mut self, cores: u32) {
        self.tenant_cores = cores;
    }

    /// The next window or variance edge.
    pub(crate) fn next_edge(&self) -> Instant {
        self.next_window.min(self.next_variance)
    }

    /// The window's length, seconds.
    pub(crate) fn secs(&self) -> f64 {
        self.window.as_secs_f64()
    }

    /// True (once) when a measurement window ends at `now`; the next one starts.
    pub(crate) fn window_due(&mut self, now: Instant) -> bool {
        if now < self.next_window {
            return false;
        }
        self.next_window = self.next_window + self.window;
        true
    }

    /// True when URSched's variance window is due to roll at `now`.
    pub(crate) fn variance_due(&self, now: Instant) -> bool {
        now >= self.next_variance
    }

    /// Rolls URSched's variance window (when [`Windows::variance_due`]).
    pub(crate) fn roll_variance(&mut self) {
        self.next_variance = self.next_variance + self.variance_window;
        self.sched
            .variance_window(self.variance_window.as_secs_f64());
    }

    /// True (once per period) when the recalled entries' rates are due to the plane.
    pub(crate) fn stats_due(&mut self, now: Instant) -> bool {
        if now < self.next_stats {
            return false;
        }
        self.next_stats = now + self.rebalance_period;
        true
    }

    /// Closes the window: the load it measured from `totals` (cumulative) and `utils`, with
    /// the plane's last report; and the recall headroom of the next window, what the fast
    /// path can still take below `target_util` of `hw_pps_limit`, packets/s.
    pub(crate) fn close(
        &mut self,
        totals: Totals,
        utils: Utils,
        plane_util: f64,
        workers: u32,
        target_util: f64,
        hw_pps_limit: f64,
    ) -> (Load, f64) {
        let secs = self.secs();
        let load = Load {
            hw_util: utils.hw,
            soc_util: utils.soc,
            dpu_drops: totals.drops - self.base.drops,
            table_util: utils.table,
            mem_util: utils.mem,
            host_pps: (totals.steered - self.base.steered) as f64 / secs,
            host_cps: (totals.steered_new - self.base.steered_new) as f64 / secs,
            dpu_cps: (totals.soc_new - self.base.soc_new) as f64 / secs,
            plane_util,
            workers,
            tenant_cores: self.tenant_cores,
        };
        self.base = totals;
        self.last_load = load;
        let headroom = ((target_util - load.hw_util) * hw_pps_limit).max(0.0);
        (load, headroom)
    }

    /// URSched's decisions for `load` with the plane in `plane`, into a buffer the caller
    /// hands back with [`Windows::give_back`] (no allocation per window).
    pub(crate) fn decide(&mut self, load: &Load, plane: PlaneView) -> Vec<Decision> {
        let mut decisions = core::mem::take(&mut self.decisions);
        decisions.clear();
        self.sched.window(load, plane, &mut decisions);
        decisions
    }

    /// Returns the decisions buffer.
    pub(crate) fn give_back(&mut self, decisions: Vec<Decision>) {
        self.decisions = decisions;
    }

    /// The load of the last window.
    pub(crate) fn last_load(&self) -> &Load {
        &self.last_load
    }
}
