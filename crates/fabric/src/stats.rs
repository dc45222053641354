//! Counters, drop reasons and the latency histogram the nodes keep. Metric names are dotted
//! lowercase and documented where declared.

use core::fmt;

/// Why the fabric dropped a packet. Every drop is counted by reason; `lost_packets` in a report
/// is every drop except [`FabricDrop::Policy`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum FabricDrop {
    /// `dpu.hw.overload`: the fast path's input queue was full (packet rate above its limit).
    HwOverload,
    /// `dpu.soc.queue_full`: the slow path's queue was full.
    SocQueueFull,
    /// `dpu.mem_full`: no DPU memory for a new connection.
    MemFull,
    /// `dpu.steer.overload`: redirect steering above line rate.
    SteerOverload,
    /// `vnic.phy.ring_full`: a phy vNIC ring was full (either direction).
    VnicRingFull,
    /// `pcie.link_full`: a direction of the PCIe link had `pcie.link_queue_packets` queued.
    PcieLinkFull,
    /// `spill.queue_full`: the spill plane's workers were saturated.
    SpillQueueFull,
    /// `spill.tenant_share`: the packet's tenant held its share of the spill plane's workers
    /// (`host.tenant_worker_share`).
    SpillTenantShare,
    /// `spill.cache_full`: the spill plane's flow cache had no room for a new connection.
    SpillCacheFull,
    /// `spill.failed`: in flight in a spill plane that failed.
    SpillFailed,
    /// `fabric.no_state`: a packet of a connection that the plane it reached has no state for.
    /// Zero unless the connection opened with a dropped packet; for an established connection
    /// this would break state continuity (a checker fails on it).
    NoState,
    /// `fabric.after_close`: a packet of a connection whose last packet had already been
    /// delivered and its state removed: it took a slower path than its close (steered to the
    /// plane while the close took the recalled fast path, say) and arrived after it, as TCP's
    /// TIME_WAIT would see it. Counted apart from `fabric.no_state`, which means lost state.
    AfterClose,
    /// `policy.deny`: the vSwitch policy denied it (security group). Not a loss.
    Policy,
}

impl FabricDrop {
    /// Every reason, in metric order.
    pub const ALL: [FabricDrop; 13] = [
        FabricDrop::HwOverload,
        FabricDrop::SocQueueFull,
        FabricDrop::MemFull,
        FabricDrop::SteerOverload,
        FabricDrop::VnicRingFull,
        FabricDrop::PcieLinkFull,
        FabricDrop::SpillQueueFull,
        FabricDrop::SpillTenantShare,
        FabricDrop::SpillCacheFull,
        FabricDrop::SpillFailed,
        FabricDrop::NoState,
        FabricDrop::AfterClose,
        FabricDrop::Policy,
    ];

    /// The metric name.
    pub fn metric(self) -> &'static str {
        match self {
            FabricDrop::HwOverload => "dpu.hw.overload",
            FabricDrop::SocQueueFull => "dpu.soc.queue_full",
            FabricDrop::MemFull => "dpu.mem_full",
            FabricDrop::SteerOverload => "dpu.steer.overload",
            FabricDrop::VnicRingFull => "vnic.phy.ring_full",
            FabricDrop::PcieLinkFull => "pcie.link_full",
            FabricDrop::SpillQueueFull => "spill.queue_full",
            FabricDrop::SpillTenantShare => "spill.tenant_share",
            FabricDrop::SpillCacheFull => "spill.cache_full",
            FabricDrop::SpillFailed => "spill.failed",
            FabricDrop::NoState => "fabric.no_state",
            FabricDrop::AfterClose => "fabric.after_close",
            FabricDrop::Policy => "policy.deny",
        }
    }
}

impl fmt::Display for FabricDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.metric())
    }
}

/// Packets dropped, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops([u64; FabricDrop::ALL.len()]);

impl Drops {
    /// Counts `n` drops of `reason`.
    pub fn add(&mut self, reason: FabricDrop, n: u64) {
        self.0[reason as usize] += n;
    }
    /// Counts what a resource refused of a batch: `offered - admitted` drops of `reason`.
    pub fn add_refused(&mut self, reason: FabricDrop, offered: u32, admitted: u32) {
        self.add(reason, u64::from(offered - admitted));
    }
    /// Drops of `reason`.
    pub fn get(&self, reason: FabricDrop) -> u64 {
        self.0[reason as usize]
    }
    /// All drops.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    /// All drops except policy denials: the packets the fabric lost.
    pub fn lost(&self) -> u64 {
        self.total() - self.get(FabricDrop::Policy)
    }
    /// Sum with another set.
    pub fn merged(&self, other: &Drops) -> Drops {
        let mut d = *self;
        for i in 0..d.0.len() {
            d.0[i] += other.0[i];
        }
        d
    }
    /// `(metric, count)` for every reason, in metric order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        FabricDrop::ALL.iter().map(|r| (r.metric(), self.get(*r)))
    }
}

/// A log-linear latency histogram (8 sub-buckets per power of two: <= 12.5% relative error),
/// nanoseconds, counts weighted by packets. Fixed size; recording never allocates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatencyHist {
    counts: Box<[u64; 64 * 8]>,
    total: u64,
    /// Sum of the recorded latencies, ns (for the mean; saturating).
    sum_ns: u64,
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist {
            counts: Box::new([0; 64 * 8]),
            total: 0,
            sum_ns: 0,
        }
    }
}

impl LatencyHist {
    fn index(ns: u64) -> usize {
        if ns < 8 {
            return ns as usize;
        }
        let exp = 63 - ns.leading_zeros() as usize; // >= 3
        let sub = ((ns >> (exp - 3)) & 7) as usize;
        (exp - 2) * 8 + sub
    }

    fn lower_bound(idx: usize) -> u64 {
        if idx < 8 {
            return idx as u64;
        }
        let exp = idx / 8 + 2;
        let sub = (idx % 8) as u64;
        (8 + sub) << (exp - 3)
    }

    /// Records `n` packets of latency `ns`.
    pub fn record(&mut self, ns: u64, n: u64) {
        self.counts[Self::index(ns)] += n;
        self.total += n;
        self.sum_ns = self.sum_ns.saturating_add(ns.saturating_mul(n));
    }

    /// Packets recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Mean of the recorded latencies, ns (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.total as f64
        }
    }

    /// The latency at quantile `q` in [0, 1], ns (the bucket's lower bound); 0 if empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::lower_bound(i);
            }
        }
        Self::lower_bound(self.counts.len() - 1)
    }

    /// Adds another histogram.
    pub fn merge(&mut self, other: &LatencyHist) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.counts.fill(0);
        self.total = 0;
        self.sum_ns = 0;
    }
}

/// Tenants [`TenantStats`] keeps apart; the packets of any further tenant are counted
/// together under [`TenantStats::OTHERS`].
pub const TENANT_STATS_MAX: usize = 256;

/// One tenant's delivered packets, lost packets and latency.
#[derive(Clone, Debug, Default)]
pub struct TenantStat {
    /// Packets delivered (into a VM or onto the wire).
    pub delivered: u64,
    /// Packets lost to a full resource on the way (the drop reasons of [`FabricDrop`] that a
    /// shared capacity causes: fast path, SoC, steering, vNIC rings, PCIe, plane workers and
    /// the per-tenant share of them).
    pub lost: u64,
    /// Latency of the delivered packets.
    pub latency: LatencyHist,
}

/// Delivery, loss and latency by tenant: what one tenant's burst cost the others. Bounded:
/// [`TENANT_STATS_MAX`] tenants apart (a histogram of 4 KiB each, made when a tenant is first
/// seen, never per packet), the rest together.
///
/// It is on the per-packet path of both nodes, so a known tenant's entry is found by one
/// index into a table by tenant id (ids below [`TENANTS_DIRECT`]; larger ids by a binary
/// search of the few entries), not by a map lookup.
#[derive(Clone, Debug, Default)]
pub struct TenantStats {
    /// Entries in tenant order.
    slots: Vec<(u32, TenantStat)>,
    /// Tenant id -> 1 + its entry's index in `slots` (0: none yet), for ids below
    /// [`TENANTS_DIRECT`]; grows to the largest such id seen (2 bytes an id, 128 KiB at most).
    index: Vec<u16>,
}

/// Tenant ids found by direct index in [`TenantStats`] (URSched's table is as large).
pub const TENANTS_DIRECT: u32 = crate::ursched::TENANTS_MAX as u32;

impl TenantStats {
    /// The key under which tenants beyond [`TENANT_STATS_MAX`] are counted together.
    pub const OTHERS: u32 = u32::MAX;

    fn find(&self, tenant: u32) -> Option<usize> {
        if tenant < TENANTS_DIRECT {
            match self.index.get(tenant as usize) {
                Some(&i) if i > 0 => Some(usize::from(i - 1)),
                _ => None,
            }
        } else {
            self.slots.binary_search_by_key(&tenant, |s| s.0).ok()
        }
    }

    fn slot(&mut self, tenant: u32) -> &mut TenantStat {
        if let Some(i) = self.find(tenant) {
            return &mut self.slots[i].1;
        }
        // A new tenant: apart while there is room, else with the others.
        let key = if self.slots.len() < TENANT_STATS_MAX {
            tenant
        } else {
            Self::OTHERS
        };
        if let Some(i) = self.find(key) {
            return &mut self.slots[i].1;
        }
        let at = self.slots.partition_point(|s| s.0 < key);
        self.slots.insert(at, (key, TenantStat::default()));
        // Entries after `at` moved: rebuild the index (at most TENANT_STATS_MAX + 1 times).
        if key < TENANTS_DIRECT && self.index.len() <= key as usize {
            self.index.resize(key as usize + 1, 0);
        }
        for (i, (t, _)) in self.slots.iter().enumerate() {
            if let Some(e) = self.index.get_mut(*t as usize) {
                // `slots` never holds more than TENANT_STATS_MAX + 1 entries.
                *e = (i + 1) as u16;
            }
        }
        &mut self.slots[at].1
    }

    /// `n` packets of `tenant` delivered with latency `ns`.
    pub fn delivered(&mut self, tenant: u32, n: u32, ns: u64) {
        let s = self.slot(tenant);
        s.delivered += u64::from(n);
        s.latency.record(ns, u64::from(n));
    }

    /// `n` packets of `tenant` lost to a full resource.
    pub fn lost(&mut self, tenant: u32, n: u32) {
        if n > 0 {
            self.slot(tenant).lost += u64::from(n);
        }
    }

    /// Adds another table.
    pub fn merge(&mut self, other: &TenantStats) {
        for (t, o) in &other.slots {
            let s = self.slot(*t);
            s.delivered += o.delivered;
            s.lost += o.lost;
            s.latency.merge(&o.latency);
        }
    }

    /// Adds each tenant's delivered and lost packets into `out` (`(tenant, delivered, lost)`,
    /// kept in tenant order), without copying the histograms.
    pub fn add_totals(&self, out: &mut Vec<(u32, u64, u64)>) {
        for (t, s) in &self.slots {
            match out.binary_search_by_key(t, |e| e.0) {
                Ok(i) => {
                    out[i].1 += s.delivered;
                    out[i].2 += s.lost;
                }
                Err(i) => out.insert(i, (*t, s.delivered, s.lost)),
            }
        }
    }

    /// Every tenant seen, by id ([`TenantStats::OTHERS`] last).
    pub fn iter(&self) -> impl Iterator<Item = (u32, &TenantStat)> {
        self.slots.iter().map(|(t, s)| (*t, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_one_bucket() {
        let mut h = LatencyHist::default();
        for ns in 1..=10_000u64 {
            h.record(ns, 1);
        }
        let p50 = h.quantile(0.5);
        assert!((4400..=5000).contains(&p50), "p50 {p50}");
        let p99 = h.quantile(0.99);
        assert!((8700..=9900).contains(&p99), "p99 {p99}");
        assert_eq!(LatencyHist::index(LatencyHist::lower_bound(100)), 100);
    }

    #[test]
    fn lost_excludes_policy_drops() {
        let mut d = Drops::default();
        d.add(FabricDrop::Policy, 5);
        d.add(FabricDrop::HwOverload, 2);
        assert_eq!(d.total(), 7);
        assert_eq!(d.lost(), 2);
    }

    #[test]
    fn tenant_stats_keep_tenants_apart_up_to_their_bound() {
        let mut t = TenantStats::default();
        t.delivered(7, 10, 1_000);
        t.delivered(7, 10, 3_000);
        t.lost(9, 4);
        t.lost(9, 0);
        let seen: Vec<(u32, u64, u64)> =
            t.iter().map(|(id, s)| (id, s.delivered, s.lost)).collect();
        assert_eq!(seen, vec![(7, 20, 0), (9, 0, 4)]);
        let seven = t.iter().next().expect("tenant 7").1;
        assert_eq!(seven.latency.mean(), 2_000.0);
        // Past the bound, new tenants share one entry; known ones keep theirs.
        for id in 100..(100 + TENANT_STATS_MAX as u32) {
            t.lost(id, 1);
        }
        t.lost(7, 1);
        assert_eq!(t.iter().count(), TENANT_STATS_MAX + 1);
        let others = t.iter().last().expect("others");
        assert_eq!(others.0, TenantStats::OTHERS);
        assert_eq!(others.1.lost, 2);
        let mut m = TenantStats::default();
        m.merge(&t);
        m.merge(&t);
        let seven = m.iter().next().expect("tenant 7").1;
        assert_eq!((seven.delivered, seven.lost), (40, 2));
        let mut totals = vec![(7, 1, 1)];
        t.add_totals(&mut totals);
        assert_eq!(totals[0], (7, 21, 2));
        assert_eq!(totals[1], (9, 0, 4));
        assert_eq!(totals.len(), TENANT_STATS_MAX + 1);
        assert!(totals.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn tenant_stats_find_large_ids_and_keep_the_index_current() {
        let mut t = TenantStats::default();
        t.delivered(70_000, 2, 10);
        t.delivered(5, 1, 10);
        t.delivered(3, 1, 10);
        t.delivered(70_000, 2, 10);
        t.lost(5, 1);
        let seen: Vec<(u32, u64, u64)> =
            t.iter().map(|(id, s)| (id, s.delivered, s.lost)).collect();
        assert_eq!(seen, vec![(3, 1, 0), (5, 1, 1), (70_000, 4, 0)]);
    }
}
