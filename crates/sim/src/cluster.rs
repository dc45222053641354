//! The cluster model: how many more vCPUs a cluster of DPU hosts can sell when its DPUs are
//! loaded for the average and spill planes (local, then a remote pool) absorb the bursts,
//! against loading them for the peak, at equal packet loss and latency. Per tick (100 ms), not
//! per packet: a host's DPU forwards up to `dpu_pps` a tick, and what is above goes to the
//! host's own spill plane, then to the cluster's remote pool, then is lost.
//!
//! ## The workload
//!
//! Every host sells VMs of `vm_vcpus` vCPUs, up to `host_vcpus`. A VM's packet rate at tick t
//! is `mean × level(t) × burst(t)`:
//! - `mean` is the VM's own, log-normal across VMs (median `vm_median_pps`, log-sd
//!   `vm_sigma`): a few VMs carry much more than the rest;
//! - `level` is a log-normal AR(1) process with mean 1 (log-sd `level_sigma`, lag-1
//!   correlation `level_rho`): the slow drift of a tenant's load;
//! - `burst` is 1, or, during a burst, a Pareto multiplier (scale 2, shape `burst_alpha`,
//!   capped at `burst_cap`): a VM starts a burst with probability `burst_start` a tick and a
//!   burst lasts `burst_ticks` on average (geometric). With a shape under 2 the bursts' sizes
//!   have infinite variance: heavy-tailed as measured traffic is;
//! - no tick of a VM goes above `vm_pps_max`, its vNIC's limit.
//!
//! ## The two designs
//!
//! - **Peak**: no spill plane. What the DPU cannot forward in a tick is lost.
//! - **Spill**: what the DPU cannot forward goes to the host's spill plane, on the cores the host
//!   has not sold (`vcpus_per_core` vCPUs a core), up to `spill_cores_max` of them, at
//!   `spill_pps_per_core` each; what is still left goes to the remote pool once the host's
//!   overflow has lasted `remote_delay_ticks` (the cross-node set-up: the paper's ~2 s; this
//!   project's goal under 1 s), up to `pool_pps` for the whole cluster a tick; the rest is
//!   lost.
//!
//! For each design the model finds the packing (VMs per host, the same on every host) at which
//! the cluster's loss (packets lost / offered, over every host and tick) reaches `loss_max`,
//! and for the spill design also at most `remote_share_max` of the packets served remotely (a
//! remote packet crosses the fabric: the latency bound). Packing a host one VM at a time, the
//! loss between two whole numbers is interpolated linearly: the result is a cluster's average
//! VMs per host. The gain is the ratio of sellable vCPUs, less one.
//!
//! The model is deterministic: every draw comes from the seed (SplitMix64), host by host and
//! VM by VM, so the same seed gives the same answer on any machine.

use serde::Serialize;
use spillway_vswitch::workload::SplitMix64;

/// The model's parameters. See the module doc.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClusterParams {
    /// Hosts in the cluster.
    pub hosts: usize,
    /// Ticks simulated (of 100 ms).
    pub ticks: usize,
    /// vCPUs a host can sell.
    pub host_vcpus: u32,
    /// vCPUs of one VM.
    pub vm_vcpus: u32,
    /// vCPUs per physical core (hyperthreads).
    pub vcpus_per_core: u32,
    /// Packets per second a host's DPU forwards.
    pub dpu_pps: f64,
    /// Packets per second one spill-plane core forwards.
    pub spill_pps_per_core: f64,
    /// Most cores a host's spill plane takes.
    pub spill_cores_max: u32,
    /// Packets per second the remote pool serves for the whole cluster.
    pub pool_pps: f64,
    /// Ticks a host's overflow must last before the remote pool takes it.
    pub remote_delay_ticks: usize,
    /// Median of the VMs' mean rates, packets/s.
    pub vm_median_pps: f64,
    /// Log-sd of the VMs' mean rates.
    pub vm_sigma: f64,
    /// Log-sd of a VM's slow level.
    pub level_sigma: f64,
    /// Lag-1 correlation of a VM's slow level.
    pub level_rho: f64,
    /// Probability a VM starts a burst in a tick.
    pub burst_start: f64,
    /// Mean ticks of a burst.
    pub burst_ticks: f64,
    /// Pareto shape of a burst's multiplier (scale 2).
    pub burst_alpha: f64,
    /// Largest burst multiplier.
    pub burst_cap: f64,
    /// A VM's packet-rate limit (its vNIC's), packets/s: no tick of it goes above.
    pub vm_pps_max: f64,
    /// Loss allowed: packets lost / offered.
    pub loss_max: f64,
    /// Share of packets the remote pool may serve (the latency bound).
    pub remote_share_max: f64,
}

impl Default for ClusterParams {
    fn default() -> ClusterParams {
        ClusterParams {
            hosts: 3000,
            ticks: 600,
            host_vcpus: 192,
            vm_vcpus: 8,
            vcpus_per_core: 2,
            // The DPU of this project's model (`dpu.hw_pps_limit`) and the paper's: ~7.2 Mpps.
            dpu_pps: 7.2e6,
            // The paper: 2.0 Mpps of overflow on ~2.3 cores.
            spill_pps_per_core: 0.87e6,
            spill_cores_max: 8,
            // 1% of the hosts lending 8 cores each.
            pool_pps: 30.0 * 8.0 * 0.87e6,
            // The paper's cross-node failover: ~2 s.
            remote_delay_ticks: 20,
            vm_median_pps: 150e3,
            vm_sigma: 1.0,
            level_sigma: 0.3,
            level_rho: 0.95,
            burst_start: 0.01,
            burst_ticks: 3.0,
            burst_alpha: 1.5,
            burst_cap: 20.0,
            // A network-enhanced 8-vCPU instance's packet-rate limit.
            vm_pps_max: 2.0e6,
            loss_max: 1e-4,
            remote_share_max: 0.01,
        }
    }
}

impl ClusterParams {
    /// Checks every parameter's range; the error names the field and what it takes.
    pub fn validate(&self) -> Result<(), String> {
        let f = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
        f((1..=100_000).contains(&self.hosts), "hosts: 1 to 100000")?;
        f((10..=100_000).contains(&self.ticks), "ticks: 10 to 100000")?;
        f(
            self.vm_vcpus >= 1 && self.host_vcpus >= self.vm_vcpus && self.host_vcpus <= 4096,
            "host_vcpus: at least vm_vcpus (at least 1), at most 4096",
        )?;
        f(
            (1..=8).contains(&self.vcpus_per_core),
            "vcpus_per_core: 1 to 8",
        )?;
        let pos = |x: f64| x.is_finite() && x > 0.0;
        let nonneg = |x: f64| x.is_finite() && x >= 0.0;
        f(pos(self.dpu_pps), "dpu_pps: above 0")?;
        f(
            nonneg(self.spill_pps_per_core),
            "spill_pps_per_core: 0 or more",
        )?;
        f(nonneg(self.pool_pps), "pool_pps: 0 or more")?;
        f(pos(self.vm_median_pps), "vm_median_pps: above 0")?;
        f(pos(self.vm_pps_max), "vm_pps_max: above 0")?;
        f(
            nonneg(self.vm_sigma) && self.vm_sigma <= 3.0,
            "vm_sigma: 0 to 3",
        )?;
        f(
            nonneg(self.level_sigma) && self.level_sigma <= 2.0,
            "level_sigma: 0 to 2",
        )?;
        f(
            (0.0..1.0).contains(&self.level_rho),
            "level_rho: 0 to below 1",
        )?;
        f(
            (0.0..=1.0).contains(&self.burst_start),
            "burst_start: 0 to 1",
        )?;
        f(self.burst_ticks >= 1.0, "burst_ticks: 1 or more")?;
        f(
            self.burst_alpha > 1.0 && self.burst_alpha <= 10.0,
            "burst_alpha: above 1 (a finite mean), at most 10",
        )?;
        f(
            self.burst_cap >= 2.0 && self.burst_cap <= 1000.0,
            "burst_cap: 2 to 1000",
        )?;
        f(
            self.loss_max > 0.0 && self.loss_max < 1.0,
            "loss_max: above 0, below 1",
        )?;
        f(
            (0.0..=1.0).contains(&self.remote_share_max),
            "remote_share_max: 0 to 1",
        )?;
        Ok(())
    }

    fn vms_max(&self) -> usize {
        (self.host_vcpus / self.vm_vcpus) as usize
    }
}

/// One design's result on one seed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DesignResult {
    /// VMs per host at the loss (and latency) bound, averaged over the cluster.
    pub vms_per_host: f64,
    /// vCPUs the cluster sells.
    pub sellable_vcpus: f64,
    /// Whether the packing stopped at the hosts' vCPUs rather than at the bound.
    pub cpu_bound: bool,
    /// At the whole-number packing below the bound: loss, mean DPU utilisation, spill-plane
    /// cores busy on the average host, share of packets served by the remote pool.
    pub loss: f64,
    pub dpu_util: f64,
    pub spill_cores_mean: f64,
    pub remote_share: f64,
}

/// Both designs on one seed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SeedResult {
    pub seed: u64,
    pub peak: DesignResult,
    pub spill: DesignResult,
    /// Sellable vCPUs with spill / without, less one.
    pub gain: f64,
}

/// What one packing costs, summed over the hosts and ticks.
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    offered: f64,
    lost: f64,
    dpu: f64,
    spill: f64,
    remote: f64,
}

impl Outcome {
    fn loss(&self) -> f64 {
        if self.offered > 0.0 {
            self.lost / self.offered
        } else {
            0.0
        }
    }

    fn remote_share(&self) -> f64 {
        if self.offered > 0.0 {
            self.remote / self.offered
        } else {
            0.0
        }
    }
}

fn unit(rng: &mut SplitMix64) -> f64 {
    // 53 random bits in (0, 1): never 0, so logarithms are finite.
    ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

fn normal(rng: &mut SplitMix64) -> f64 {
    // Box-Muller (one of the pair).
    let (u, v) = (unit(rng), unit(rng));
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}

/// Adds one VM's packets per tick (its whole series) to `host`.
fn add_vm(p: &ClusterParams, rng: &mut SplitMix64, host: &mut [f32]) {
    let mean = p.vm_median_pps * (p.vm_sigma * normal(rng)).exp();
    let s = p.level_sigma;
    let innov = (1.0 - p.level_rho * p.level_rho).sqrt();
    let mut z = s * normal(rng);
    let end_p = 1.0 / p.burst_ticks;
    let mut burst = 1.0;
    for slot in host.iter_mut() {
        z = p.level_rho * z + innov * s * normal(rng);
        // exp(z - s²/2): mean 1 for a stationary N(0, s²).
        let level = (z - s * s / 2.0).exp();
        if burst > 1.0 {
            if unit(rng) < end_p {
                burst = 1.0;
            }
        } else if unit(rng) < p.burst_start {
            burst = (2.0 * unit(rng).powf(-1.0 / p.burst_alpha)).min(p.burst_cap);
        }
        *slot += ((mean * level * burst).min(p.vm_pps_max) / 10.0) as f32;
    }
}

/// The cluster's outcome with each host's packets per tick in `load` (host-major), for one
/// design.
fn evaluate(p: &ClusterParams, load: &[f32], vms: usize, spill: bool) -> Outcome {
    let ticks = p.ticks;
    let hosts = p.hosts;
    let dpu = p.dpu_pps / 10.0;
    let free_cores =
        (p.host_vcpus as usize - vms * p.vm_vcpus as usize) / p.vcpus_per_core as usize;
    let cores = free_cores.min(p.spill_cores_max as usize) as f64;
    let local = if spill {
        cores * p.spill_pps_per_core / 10.0
    } else {
        0.0
    };
    let pool = if spill { p.pool_pps / 10.0 } else { 0.0 };
    let mut o = Outcome::default();
    // Per host: how many ticks its overflow beyond the local plane has lasted.
    let mut run = vec![0usize; hosts];
    for t in 0..ticks {
        let mut remote_want = 0.0;
        let mut unserved = 0.0;
        for h in 0..hosts {
            let d = f64::from(load[h * ticks + t]);
            o.offered += d;
            let by_dpu = d.min(dpu);
            o.dpu += by_dpu;
            let over = d - by_dpu;
            let by_local = over.min(local);
            o.spill += by_local;
            let left = over - by_local;
            if left > 0.0 && spill {
                run[h] += 1;
                if run[h] > p.remote_delay_ticks {
                    remote_want += left;
                } else {
                    unserved += left;
                }
            } else {
                run[h] = 0;
                unserved += left;
            }
        }
        let by_pool = remote_want.min(pool);
        o.remote += by_pool;
        o.lost += unserved + remote_want - by_pool;
    }
    o
}

/// Packs each design on `seed`: VMs are added to every host one at a time until the bound is
/// passed or the hosts' vCPUs are sold.
pub fn run_seed(p: &ClusterParams, seed: u64) -> SeedResult {
    let base = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x00c1_05e7;
    let mut load = vec![0f32; p.hosts * p.ticks];
    let vms_max = p.vms_max();
    let mut last: [Option<(usize, Outcome)>; 2] = [None, None];
    let mut done: [Option<DesignResult>; 2] = [None, None];
    let ok = |o: &Outcome, spill: bool| {
        o.loss() <= p.loss_max && (!spill || o.remote_share() <= p.remote_share_max)
    };
    for vms in 1..=vms_max {
        for h in 0..p.hosts {
            // Each host's VMs come from the host's own stream: the k-th VM of host h is the same
            // whatever the other hosts hold.
            let id = ((h as u64) << 20) | vms as u64;
            let mut r = SplitMix64(base ^ id.wrapping_mul(0xd1b5_4a32_d192_ed03));
            add_vm(p, &mut r, &mut load[h * p.ticks..(h + 1) * p.ticks]);
        }
        for (k, spill) in [false, true].into_iter().enumerate() {
            if done[k].is_some() {
                continue;
            }
            let o = evaluate(p, &load, vms, spill);
            if ok(&o, spill) {
                last[k] = Some((vms, o));
                continue;
            }
            // Between the last good packing and this one: interpolate on the binding bound.
            let (n0, o0) = last[k].unwrap_or((0, Outcome::default()));
            let frac = |a: f64, b: f64, bound: f64| {
                if b > a {
                    ((bound - a) / (b - a)).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            };
            let mut x = frac(o0.loss(), o.loss(), p.loss_max);
            if spill && o.remote_share() > p.remote_share_max {
                x = x.min(frac(
                    o0.remote_share(),
                    o.remote_share(),
                    p.remote_share_max,
                ));
            }
            done[k] = Some(design(p, n0 as f64 + x * (vms - n0) as f64, false, n0, &o0));
        }
        if done.iter().all(Option::is_some) {
            break;
        }
    }
    let [peak, spill] = [0, 1].map(|k| {
        done[k].clone().unwrap_or_else(|| {
            let (n, o) = last[k].expect("a design that never passed its bound stopped at 1");
            design(p, n as f64, true, n, &o)
        })
    });
    let gain = if peak.sellable_vcpus > 0.0 {
        spill.sellable_vcpus / peak.sellable_vcpus - 1.0
    } else {
        f64::INFINITY
    };
    SeedResult {
        seed,
        peak,
        spill,
        gain,
    }
}

fn design(p: &ClusterParams, vms: f64, cpu_bound: bool, whole: usize, o: &Outcome) -> DesignResult {
    let host_ticks = (p.hosts * p.ticks) as f64;
    DesignResult {
        vms_per_host: vms,
        sellable_vcpus: vms * f64::from(p.vm_vcpus) * p.hosts as f64,
        cpu_bound,
        loss: o.loss(),
        dpu_util: if whole > 0 {
            o.dpu / host_ticks / (p.dpu_pps / 10.0)
        } else {
            0.0
        },
        spill_cores_mean: if p.spill_pps_per_core > 0.0 {
            o.spill / host_ticks / (p.spill_pps_per_core / 10.0)
        } else {
            0.0
        },
        remote_share: o.remote_share(),
    }
}

/// The mean of `xs` and the half-width of its 95% confidence interval (Student's t).
pub fn mean_ci95(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean, f64::NAN);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom, then normal.
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    let t = T.get(n - 2).copied().unwrap_or(1.96);
    (mean, t * (var / n as f64).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ClusterParams {
        ClusterParams {
            hosts: 200,
            ticks: 200,
            ..ClusterParams::default()
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_answer_and_another_seed_another() {
        let p = small();
        assert_eq!(run_seed(&p, 7), run_seed(&p, 7));
        assert_ne!(run_seed(&p, 7), run_seed(&p, 8));
    }

    #[test]
    fn without_spill_capacity_both_designs_pack_the_same() {
        let p = ClusterParams {
            spill_pps_per_core: 0.0,
            pool_pps: 0.0,
            ..small()
        };
        let r = run_seed(&p, 3);
        assert_eq!(r.peak.vms_per_host, r.spill.vms_per_host, "{r:#?}");
        assert_eq!(r.gain, 0.0);
    }

    #[test]
    fn more_spill_capacity_never_packs_fewer_vms() {
        let at = |pps: f64| {
            let p = ClusterParams {
                spill_pps_per_core: pps,
                ..small()
            };
            run_seed(&p, 5)
        };
        let (slow, fast) = (at(0.3e6), at(1.5e6));
        assert_eq!(slow.peak, fast.peak, "the peak design has no plane");
        assert!(
            fast.spill.vms_per_host >= slow.spill.vms_per_host,
            "{slow:#?} {fast:#?}"
        );
        assert!(slow.spill.vms_per_host > slow.peak.vms_per_host);
    }

    #[test]
    fn a_steady_workload_under_the_dpu_sells_every_vcpu_either_way() {
        let p = ClusterParams {
            vm_sigma: 0.0,
            level_sigma: 0.0,
            burst_start: 0.0,
            // 24 VMs of 150 kpps: 3.6 Mpps, half the DPU.
            ..small()
        };
        let r = run_seed(&p, 1);
        for d in [&r.peak, &r.spill] {
            assert!(d.cpu_bound, "{r:#?}");
            assert_eq!(d.vms_per_host, 24.0);
            assert_eq!(d.loss, 0.0);
        }
        assert_eq!(r.gain, 0.0);
        assert!((r.peak.dpu_util - 0.5).abs() < 1e-3, "{r:#?}");
    }

    #[test]
    fn the_remote_pool_serves_only_overflow_that_outlasts_its_set_up() {
        // Every VM in one long burst from the first tick: the hosts overflow for good, the
        // local planes (no free cores at the packing tried) cannot help, and the pool takes the
        // overflow after its delay only.
        let p = ClusterParams {
            hosts: 10,
            ticks: 100,
            vm_sigma: 0.0,
            level_sigma: 0.0,
            ..ClusterParams::default()
        };
        let load = vec![(10e6 / 10.0) as f32; p.hosts * p.ticks];
        let o = evaluate(&p, &load, 24, true);
        let over = (10e6 - 7.2e6) / 10.0 * (p.hosts * p.ticks) as f64;
        let delayed = (10e6 - 7.2e6) / 10.0 * (p.hosts * p.remote_delay_ticks) as f64;
        assert!((o.remote - (over - delayed)).abs() < 1.0, "{o:?}");
        assert!((o.lost - delayed).abs() < 1.0, "{o:?}");
        assert_eq!(o.spill, 0.0);
        let none = evaluate(&p, &load, 24, false);
        assert!((none.lost - over).abs() < 1.0);
    }

    #[test]
    fn bad_parameters_name_the_field() {
        let p = ClusterParams {
            burst_alpha: 1.0,
            ..ClusterParams::default()
        };
        assert!(p.validate().unwrap_err().starts_with("burst_alpha"));
        let p = ClusterParams {
            host_vcpus: 4,
            ..ClusterParams::default()
        };
        assert!(p.validate().unwrap_err().starts_with("host_vcpus"));
        ClusterParams::default().validate().unwrap();
    }

    #[test]
    fn the_interval_is_students() {
        let (m, ci) = mean_ci95(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        // sd 1, n 3: t(2) = 4.303, 4.303 / sqrt(3).
        assert!((ci - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert!(mean_ci95(&[5.0]).1.is_nan());
    }
}
