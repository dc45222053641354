//! Co-located tenants beside a busy spill plane: what the plane costs a tenant's request
//! latency and throughput on the same NUMA node, under each isolation step the paper turns on
//! in turn (pinning the plane to cores of its own, a last-level-cache partition (CAT), a memory
//! bandwidth cap (MBA)). The paper reports, with all of them on at 2.0 Mpps of overflow, the
//! tenants' throughput within 1% of the baseline and Redis p99 latency +1.5%.
//!
//! The plane reaches a tenant through three shared resources, each modelled by one mechanism:
//!
//! - **Cores.** Unpinned, the plane's threads (`pps x pkt_cost` cores' worth) float over the
//!   node's cores and take each a share of its time, in scheduler slices: a tenant request that
//!   arrives during one waits for it to end. Pinned, they run on idle cores only.
//! - **The last-level cache.** Under LRU a stream occupies the cache in proportion to the rate
//!   at which it inserts lines; the plane's packets are fresh lines at every packet, so without
//!   a partition it occupies up to its footprint (rings in flight, the hot part of its flow
//!   cache) and the tenants' share shrinks. With CAT it is confined to its ways. A tenant's
//!   misses per request grow as the square root of the cache it lost (the "sqrt(2) rule": half
//!   the cache, 1.41 times the misses).
//! - **Memory bandwidth.** A miss costs the loaded latency of the node's memory,
//!   `idle x (1 + knee x rho / (1 - rho))` at utilisation `rho`, the shape of a loaded-latency
//!   curve; the plane's traffic (`pps x bytes per packet`) adds to the tenants'. MBA caps the
//!   plane's share; a plane that would need more carries less (`plane_pps` in the result).
//!
//! A tenant core is a FIFO server of requests arriving as a Poisson stream at a fixed load;
//! a request's service is its CPU time plus its misses (a Poisson count) times the loaded
//! latency; latency is queueing plus service plus any stolen slice. The percentiles come from
//! simulating `requests` requests with a seeded generator, the same draws for every step
//! (common random numbers), so a step's ratio to the baseline is not sampling noise. The
//! defaults are a two-socket 64-core host as the paper's and a Redis-like tenant; each says
//! where it comes from ([paper], or [assumed] with the reasoning). What the model leaves out:
//! the interconnect (the tenant is on the plane's node, the worst case), PCIe (the `vatc`
//! scenario models crossings), hyper-thread siblings (the plane's cores are whole cores), and
//! the tenants' own interference with each other (the baseline has it too).

use serde::Serialize;
use spillway_fabric::params::FabricParams;
use spillway_vswitch::workload::SplitMix64;

/// The host node, the tenant and the plane's footprint. See the module doc.
#[derive(Clone, Debug, Serialize)]
pub struct IsolationParams {
    /// Cores of the node the tenant and the plane share. [paper]: a 64-core host; [assumed]:
    /// two sockets of 32.
    pub node_cores: u32,
    /// Of those, cores running tenants. [assumed]: 24 (`host.tenant_cores` 48 over two nodes).
    pub tenant_cores: u32,
    /// Last-level cache of the node, bytes. [assumed]: 48 MiB (a 32-core server part).
    pub llc_bytes: f64,
    /// Cache ways, for CAT. [assumed]: 12.
    pub llc_ways: u32,
    /// Sustainable memory bandwidth of the node, bytes/s. [assumed]: 140 GB/s (8 channels of
    /// DDR4-3200, 205 GB/s peak, ~70% sustainable).
    pub mem_bandwidth: f64,
    /// Idle memory latency, ns. [assumed]: 90.
    pub mem_latency_ns: f64,
    /// Loaded-latency knee: latency = idle x (1 + knee x rho / (1 - rho)). [assumed]: 0.35
    /// (2.4 times idle at 80% utilisation, the shape of measured loaded-latency curves).
    pub latency_knee: f64,
    /// CPU time of one tenant request outside its cache misses, ns. [assumed]: 6,000 (a Redis
    /// GET with its system calls).
    pub req_cpu_ns: f64,
    /// Last-level cache misses of one request with the whole cache. [assumed]: 20.
    pub req_misses: f64,
    /// Tenant load per core (utilisation at the baseline). [assumed]: 0.5.
    pub tenant_load: f64,
    /// Memory traffic of one tenant core besides its requests' misses, bytes/s. [assumed]:
    /// 2 GB/s.
    pub tenant_background_bw: f64,
    /// Spilled packets per second the plane carries. [paper]: 2.0 Mpps.
    pub plane_pps: f64,
    /// Plane core time per packet, ns. [paper]: `host.pkt_cost`, 1,150 (2.0 Mpps on ~2.3
    /// cores).
    pub pkt_cost_ns: f64,
    /// Memory traffic per spilled packet, bytes. [assumed]: 2,256 (a 1,000-byte packet written
    /// into the plane's ring and read out of it, and four 64-byte lines of state).
    pub plane_bytes_per_pkt: f64,
    /// Cache lines the plane inserts per packet. [assumed]: 20 (16 for the packet, 4 of
    /// state).
    pub plane_lines_per_pkt: f64,
    /// The plane's cache footprint, bytes: what it can occupy at most. [assumed]: 16 MiB
    /// (packets in flight in its rings and the hot part of its flow cache).
    pub plane_footprint: f64,
    /// Cache ways CAT gives the plane. [assumed]: 2 (as DDIO's default two ways).
    pub plane_cat_ways: u32,
    /// Share of the node's memory bandwidth MBA allows the plane. [assumed]: 0.1.
    pub plane_mba_share: f64,
    /// Scheduler slice an unpinned plane thread runs for on a tenant's core, ns. [assumed]:
    /// 3,000,000 (Linux's default base slice; a busy-polling thread uses all of it).
    pub slice_ns: f64,
    /// Requests simulated per step.
    pub requests: usize,
}

impl Default for IsolationParams {
    fn default() -> Self {
        let f = FabricParams::default();
        IsolationParams {
            node_cores: 32,
            tenant_cores: 24,
            llc_bytes: 48.0 * MIB,
            llc_ways: 12,
            mem_bandwidth: 140e9,
            mem_latency_ns: 90.0,
            latency_knee: 0.35,
            req_cpu_ns: 6_000.0,
            req_misses: 20.0,
            tenant_load: 0.5,
            tenant_background_bw: 2e9,
            plane_pps: 2.0e6,
            pkt_cost_ns: f.host.pkt_cost.as_nanos() as f64,
            plane_bytes_per_pkt: 2_256.0,
            plane_lines_per_pkt: 20.0,
            plane_footprint: 16.0 * MIB,
            plane_cat_ways: 2,
            plane_mba_share: 0.1,
            slice_ns: 3e6,
            requests: 200_000,
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Which isolation is on (cumulative in the paper's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Isolation {
    /// A plane runs at all (false: the baseline).
    pub plane: bool,
    /// Its threads pinned to cores of their own.
    pub pinned: bool,
    /// Its cache confined to `plane_cat_ways`.
    pub cat: bool,
    /// Its memory bandwidth capped at `plane_mba_share`.
    pub mba: bool,
}

impl Isolation {
    /// The baseline and the ladder: no plane; a plane with no isolation; pinned; + CAT;
    /// + MBA.
    pub const LADDER: [(&'static str, Isolation); 5] = [
        (
            "baseline (no plane)",
            Isolation::new(false, false, false, false),
        ),
        (
            "plane, no isolation",
            Isolation::new(true, false, false, false),
        ),
        ("pinned", Isolation::new(true, true, false, false)),
        ("pinned + CAT", Isolation::new(true, true, true, false)),
        ("pinned + CAT + MBA", Isolation::new(true, true, true, true)),
    ];

    const fn new(plane: bool, pinned: bool, cat: bool, mba: bool) -> Isolation {
        Isolation {
            plane,
            pinned,
            cat,
            mba,
        }
    }
}

/// What a step costs the tenant.
#[derive(Clone, Debug, Serialize)]
pub struct TenantEffect {
    /// Packets per second the plane carries (less than asked if MBA capped it).
    pub plane_pps: f64,
    /// Plane cores.
    pub plane_cores: f64,
    /// Share of each tenant core's time the plane takes (unpinned only).
    pub stolen: f64,
    /// Cache the tenants hold, MiB.
    pub tenant_llc_mib: f64,
    /// Memory utilisation of the node.
    pub mem_utilisation: f64,
    /// Loaded memory latency, ns.
    pub mem_latency_ns: f64,
    /// Mean service time of a request, us.
    pub service_us: f64,
    /// Tenant throughput a core can give, against the baseline's.
    pub throughput_ratio: f64,
    /// Request latency percentiles, us.
    pub p50_us: f64,
    pub p99_us: f64,
}

/// The tenant under isolation `iso`, with the draws of `seed`.
pub fn tenant_effect(p: &IsolationParams, iso: Isolation, seed: u64) -> TenantEffect {
    let base = steady(p, Isolation::LADDER[0].1);
    let st = steady(p, iso);
    // The arrival rate is the baseline's load: the tenant's demand does not change.
    let arrival_ns = base.service_ns / p.tenant_load;
    let (p50, p99) = simulate(p, &st, arrival_ns, seed);
    TenantEffect {
        plane_pps: st.plane_pps,
        plane_cores: st.plane_pps * p.pkt_cost_ns / 1e9,
        stolen: st.stolen,
        tenant_llc_mib: st.tenant_llc / MIB,
        mem_utilisation: st.rho,
        mem_latency_ns: st.latency_ns,
        service_us: st.service_ns / 1e3,
        throughput_ratio: (1.0 - st.stolen) * base.service_ns / st.service_ns,
        p50_us: p50 / 1e3,
        p99_us: p99 / 1e3,
    }
}

/// The resources' steady state under a step.
#[derive(Clone, Copy, Debug)]
struct Steady {
    plane_pps: f64,
    stolen: f64,
    tenant_llc: f64,
    rho: f64,
    latency_ns: f64,
    misses: f64,
    service_ns: f64,
}

fn steady(p: &IsolationParams, iso: Isolation) -> Steady {
    let mut pps = if iso.plane { p.plane_pps } else { 0.0 };
    let tenant_bw = f64::from(p.tenant_cores) * p.tenant_background_bw;
    if iso.mba {
        // The cap on the plane's traffic caps what it carries.
        let cap = p.plane_mba_share * p.mem_bandwidth / p.plane_bytes_per_pkt;
        pps = pps.min(cap);
    }
    let plane_cores = pps * p.pkt_cost_ns / 1e9;
    let stolen = if iso.plane && !iso.pinned {
        // Spread over the node's cores, tenants' included.
        (plane_cores / f64::from(p.node_cores)).min(1.0)
    } else {
        0.0
    };
    let way = p.llc_bytes / f64::from(p.llc_ways);
    // A fixed point: the tenants' cache share sets their misses, which set their insertion
    // rate, which sets their share. A few rounds settle it (the map is a contraction here).
    // It starts from the idle node: the whole cache, idle latency.
    let mut misses = p.req_misses;
    let mut tenant_llc = p.llc_bytes;
    let mut latency_ns = p.mem_latency_ns;
    let mut service_ns = p.req_cpu_ns + misses * latency_ns;
    let mut rho: f64 = 0.0;
    for _ in 0..8 {
        // The tenants' requests per second at their (fixed) load, and the lines they insert.
        let req_rate = f64::from(p.tenant_cores) * p.tenant_load * 1e9 / service_ns;
        let plane_llc = if pps == 0.0 {
            0.0
        } else if iso.cat {
            way * f64::from(p.plane_cat_ways)
        } else {
            // LRU occupancy in proportion to insertion rates, bounded by the footprint.
            let plane_rate = pps * p.plane_lines_per_pkt;
            let tenant_rate = req_rate * misses;
            (p.llc_bytes * plane_rate / (plane_rate + tenant_rate)).min(p.plane_footprint)
        };
        tenant_llc = p.llc_bytes - plane_llc;
        misses = p.req_misses * (p.llc_bytes / tenant_llc).sqrt();
        let bw = tenant_bw + req_rate * misses * 64.0 + pps * p.plane_bytes_per_pkt;
        rho = (bw / p.mem_bandwidth).min(0.95);
        latency_ns = p.mem_latency_ns * (1.0 + p.latency_knee * rho / (1.0 - rho));
        service_ns = p.req_cpu_ns + misses * latency_ns;
    }
    Steady {
        plane_pps: pps,
        stolen,
        tenant_llc,
        rho,
        latency_ns,
        misses,
        service_ns,
    }
}

/// One tenant core's request latencies (p50, p99, ns): Poisson arrivals of mean gap
/// `arrival_ns`, service `req_cpu + misses x latency` with a Poisson miss count, FIFO, and (if
/// the plane is unpinned) the core taken away for `slice_ns` at a time, `stolen` of the time.
fn simulate(p: &IsolationParams, st: &Steady, arrival_ns: f64, seed: u64) -> (f64, f64) {
    // Separate streams, so that every step draws the same arrivals and the same miss quantiles.
    let mut arrivals = SplitMix64(seed ^ 0xa11);
    let mut misses = SplitMix64(seed ^ 0x5e4);
    let mut stolen = SplitMix64(seed ^ 0x57e);
    let mut lat = Vec::with_capacity(p.requests);
    let mut t = 0.0;
    let mut free_at = 0.0;
    // The next stolen interval [start, end), drawn lazily.
    let mut steal = next_steal(&mut stolen, 0.0, st.stolen, p.slice_ns);
    for _ in 0..p.requests {
        t += -arrival_ns * (1.0 - unit(&mut arrivals)).ln();
        let n = poisson(st.misses, unit(&mut misses));
        let mut work = p.req_cpu_ns + n * st.latency_ns;
        let mut now = t.max(free_at);
        // Work only while the core is the tenant's.
        while work > 0.0 {
            if let Some((s, e)) = steal {
                if now >= e {
                    steal = next_steal(&mut stolen, e, st.stolen, p.slice_ns);
                    continue;
                }
                if now >= s {
                    now = e;
                    continue;
                }
                let run = work.min(s - now);
                now += run;
                work -= run;
            } else {
                now += work;
                work = 0.0;
            }
        }
        free_at = now;
        lat.push(now - t);
    }
    lat.sort_unstable_by(f64::total_cmp);
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    (at(0.5), at(0.99))
}

/// The first stolen interval after `from`: the core is the tenant's for an exponential time of
/// mean `slice x (1 - share) / share`, then the plane's for `slice`. None if `share` is 0.
fn next_steal(rng: &mut SplitMix64, from: f64, share: f64, slice: f64) -> Option<(f64, f64)> {
    if share <= 0.0 {
        return None;
    }
    let gap = -slice * (1.0 - share) / share * (1.0 - unit(rng)).ln();
    Some((from + gap, from + gap + slice))
}

fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The Poisson(`mean`) quantile at `u` (inversion: one draw per sample, so the same `u` gives
/// a comparable count at every mean).
fn poisson(mean: f64, u: f64) -> f64 {
    let mut k = 0.0;
    let mut term = (-mean).exp();
    let mut cdf = term;
    while cdf < u && k < 10.0 * mean + 50.0 {
        k += 1.0;
        term *= mean / k;
        cdf += term;
    }
    k
}

/// Every step of the ladder and its effect, with ratios to the baseline.
#[derive(Clone, Debug, Serialize)]
pub struct LadderRow {
    pub step: &'static str,
    pub isolation: Isolation,
    pub effect: TenantEffect,
    pub p50_ratio: f64,
    pub p99_ratio: f64,
}

/// The ladder at `p`.
pub fn ladder(p: &IsolationParams, seed: u64) -> Vec<LadderRow> {
    let rows: Vec<(&'static str, Isolation, TenantEffect)> = Isolation::LADDER
        .iter()
        .map(|&(name, iso)| (name, iso, tenant_effect(p, iso, seed)))
        .collect();
    let (b50, b99) = (rows[0].2.p50_us, rows[0].2.p99_us);
    rows.into_iter()
        .map(|(step, isolation, effect)| LadderRow {
            step,
            isolation,
            p50_ratio: effect.p50_us / b50,
            p99_ratio: effect.p99_us / b99,
            effect,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> IsolationParams {
        IsolationParams {
            requests: 40_000,
            ..IsolationParams::default()
        }
    }

    #[test]
    fn the_baseline_is_itself_and_the_same_seed_gives_the_same_figures() {
        let p = small();
        let a = ladder(&p, 7);
        let b = ladder(&p, 7);
        assert_eq!(a[0].p99_ratio, 1.0);
        assert_eq!(a[0].effect.throughput_ratio, 1.0);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
    }

    #[test]
    fn each_isolation_step_costs_the_tenant_no_more_than_the_one_before() {
        let p = small();
        let rows = ladder(&p, 1);
        for w in rows[1..].windows(2) {
            assert!(
                w[1].p99_ratio <= w[0].p99_ratio + 1e-9,
                "{} p99 {} after {} p99 {}",
                w[1].step,
                w[1].p99_ratio,
                w[0].step,
                w[0].p99_ratio
            );
            assert!(w[1].effect.throughput_ratio >= w[0].effect.throughput_ratio - 1e-9);
        }
        // An unpinned plane's slices are the tenant's tail; pinning removes them.
        assert!(rows[1].p99_ratio > 2.0, "{:?}", rows[1]);
        assert!(rows[2].effect.stolen == 0.0);
    }

    #[test]
    fn a_busier_plane_costs_more_and_no_plane_costs_nothing() {
        let at = |pps: f64| {
            let p = IsolationParams {
                plane_pps: pps,
                ..small()
            };
            ladder(&p, 3)[2].p99_ratio
        };
        assert_eq!(at(0.0), 1.0);
        assert!(
            at(0.5e6) <= at(2e6) && at(2e6) <= at(8e6),
            "{} {} {}",
            at(0.5e6),
            at(2e6),
            at(8e6)
        );
    }

    #[test]
    fn mba_caps_what_the_plane_carries_when_it_would_need_more() {
        let p = IsolationParams {
            plane_mba_share: 0.01,
            ..small()
        };
        let r = &ladder(&p, 1)[4];
        let cap = 0.01 * p.mem_bandwidth / p.plane_bytes_per_pkt;
        assert!((r.effect.plane_pps - cap).abs() < 1.0, "{r:?}");
        assert!(r.effect.plane_pps < p.plane_pps);
    }

    #[test]
    fn poisson_inversion_has_the_right_mean() {
        let mut rng = SplitMix64(9);
        let n = 20_000;
        let mean: f64 = (0..n).map(|_| poisson(20.0, unit(&mut rng))).sum::<f64>() / n as f64;
        assert!((mean - 20.0).abs() < 0.2, "{mean}");
    }
}
