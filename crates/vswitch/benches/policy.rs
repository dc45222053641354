//! Policy lookups on the slow path, which runs them once per new connection on a ~1 µs budget.
//!
//! - `vswitch/policy/lpm_10k_routes`: `Policy::route` for one tenant holding 10,000 IPv4 routes of
//!   mixed lengths (/8 to /32, nested and overlapping) plus its subnets; random destinations.
//!   Budget ~50 ns. `lpm_10k_routes_v6` is the same over 10,000 IPv6 routes (/16 to /128).
//! - `vswitch/policy/sg_1k_rules`: `Policy::sg_evaluate` on a port whose four groups hold 1,000
//!   ingress rules (mixed protocols, prefixes /8 to /32, port ranges), random first packets; most
//!   fall through to the default, the classifier's worst case (every bit-vector word is ANDed).
//!   Budget ~150 ns.
//!
//! Inputs come from SplitMix64 with fixed seeds, so every run measures the same tables and
//! probes. Policies are built programmatically through `PolicyConfig`, as a control plane would.

use criterion::{Criterion, criterion_group, criterion_main};
use spillway_vswitch::policy::{
    HostSection, PolicyConfig, PortSection, PortsSection, ProtocolSection, RouteSection,
    RouteTargetSection, RuleSection, SecurityGroupSection, SgAction, TenantSection,
};
use spillway_vswitch::{Direction, PortId, TenantId, policy::Policy};
use spillway_wire::{FlowKey, IpAddr16, ip_proto};
use std::collections::BTreeSet;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

/// SplitMix64 (Steele, Lea, Flood 2014): a stable, seedable generator.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const PROBES: usize = 4096;

fn base_config() -> PolicyConfig {
    PolicyConfig {
        host: HostSection {
            uplink_port: 0,
            uplink_mac: "02:00:00:00:00:01".into(),
            vtep_ip: "192.0.2.1".into(),
            gateway_mac: "02:00:00:00:00:fe".into(),
            vxlan_port: 4789,
            underlay_mtu: None,
        },
        tenants: vec![TenantSection {
            id: 1,
            name: "bench".into(),
            vni: 1001,
            router_mac: "02:00:00:00:01:01".into(),
            subnets: vec!["172.16.0.0/12".into(), "fd00:1::/64".into()],
            snat: None,
            router_ips: None,
            routes: Vec::new(),
            on_policy_change: None,
        }],
        ports: Vec::new(),
        security_groups: Vec::new(),
    }
}

fn lpm_policy(v6: bool, rng: &mut SplitMix64) -> Policy {
    let mut cfg = base_config();
    let mut seen = BTreeSet::new();
    let targets = [
        RouteTargetSection::Tunnel("192.0.2.2".into()),
        RouteTargetSection::Internet,
        RouteTargetSection::Blackhole,
        RouteTargetSection::Local,
    ];
    while cfg.tenants[0].routes.len() < 10_000 {
        let prefix = if v6 {
            let len = 16 + rng.below(113) as u32;
            let bits =
                (u128::from(rng.next()) << 64 | u128::from(rng.next())) & !(u128::MAX >> len);
            // Keep out of the tenant's subnet and the IPv4-mapped range by fixing the top bits.
            let bits = (bits & (u128::MAX >> 8)) | (0x20u128 << 120);
            format!("{}/{len}", Ipv6Addr::from(bits))
        } else {
            let len = 8 + rng.below(25) as u32;
            let bits = (rng.next() as u32) & !(u32::MAX.checked_shr(len).unwrap_or(0));
            format!("{}/{len}", Ipv4Addr::from(bits))
        };
        // Normalised form dedups prefixes that differ only in host bits (and the subnet).
        if prefix.starts_with("172.16.0.0/12") || !seen.insert(prefix.clone()) {
            continue;
        }
        let target = targets[rng.below(4) as usize].clone();
        cfg.tenants[0].routes.push(RouteSection { prefix, target });
    }
    Policy::compile(cfg, "<bench>").expect("bench policy is valid")
}

fn bench_lpm(c: &mut Criterion) {
    for (name, v6, seed) in [("lpm_10k_routes", false, 1), ("lpm_10k_routes_v6", true, 2)] {
        let mut rng = SplitMix64(seed);
        let policy = lpm_policy(v6, &mut rng);
        let probes: Vec<IpAddr16> = (0..PROBES)
            .map(|_| {
                if v6 {
                    let bits = u128::from(rng.next()) << 64 | u128::from(rng.next());
                    IpAddr16::from(Ipv6Addr::from(
                        (bits & (u128::MAX >> 8)) | (0x20u128 << 120),
                    ))
                } else {
                    IpAddr16::from(Ipv4Addr::from(rng.next() as u32))
                }
            })
            .collect();
        let hits = probes
            .iter()
            .filter(|&&ip| policy.route(TenantId(1), ip).is_some())
            .count();
        eprintln!("{name}: {hits}/{PROBES} probes match a route");
        let mut i = 0usize;
        c.bench_function(&format!("vswitch/policy/{name}"), |b| {
            b.iter(|| {
                let ip = probes[i % PROBES];
                i = i.wrapping_add(1);
                black_box(policy.route(black_box(TenantId(1)), black_box(ip)))
            })
        });
    }
}

fn sg_policy(rng: &mut SplitMix64) -> Policy {
    let mut cfg = base_config();
    for g in 0..4u32 {
        let mut rules = Vec::new();
        for _ in 0..250 {
            let (protocol, ports) = match rng.below(4) {
                0 => ("tcp", true),
                1 => ("udp", true),
                2 => ("icmp", false),
                _ => ("any", false),
            };
            let len = 8 + rng.below(25) as u32;
            let bits = (rng.next() as u32) & !(u32::MAX.checked_shr(len).unwrap_or(0));
            let lo = rng.below(60_000) as u16;
            let hi = lo + rng.below(100) as u16;
            rules.push(RuleSection {
                direction: Direction::Ingress,
                priority: rng.below(1000) as u32,
                action: if rng.below(2) == 0 {
                    SgAction::Allow
                } else {
                    SgAction::Deny
                },
                protocol: ProtocolSection::Name(protocol.into()),
                remote: format!("{}/{len}", Ipv4Addr::from(bits)),
                ports: ports.then(|| PortsSection::Text(format!("{lo}-{hi}"))),
            });
        }
        cfg.security_groups.push(SecurityGroupSection {
            id: g + 1,
            tenant: 1,
            rules,
        });
    }
    cfg.ports.push(PortSection {
        id: 10,
        tenant: 1,
        mac: "02:00:00:01:00:0a".into(),
        ips: vec!["172.16.0.10".into()],
        security_groups: vec![1, 2, 3, 4],
        mtu: None,
    });
    Policy::compile(cfg, "<bench>").expect("bench policy is valid")
}

fn bench_sg(c: &mut Criterion) {
    let mut rng = SplitMix64(3);
    let policy = sg_policy(&mut rng);
    let protos = [ip_proto::TCP, ip_proto::UDP, ip_proto::ICMP, 47];
    let probes: Vec<FlowKey> = (0..PROBES)
        .map(|_| FlowKey {
            src_ip: IpAddr16::from(Ipv4Addr::from(rng.next() as u32)),
            dst_ip: IpAddr16::from_v4([172, 16, 0, 10]),
            src_port: 40000,
            dst_port: rng.below(65536) as u16,
            proto: protos[rng.below(4) as usize],
        })
        .collect();
    let matched = probes
        .iter()
        .filter(|k| {
            !matches!(
                policy.sg_evaluate(PortId(10), Direction::Ingress, k),
                spillway_vswitch::policy::SgDecision::DefaultDeny
            )
        })
        .count();
    let (classifiers, bytes) = policy.sg_memory();
    eprintln!(
        "sg_1k_rules: {matched}/{PROBES} probes match a rule; {classifiers} classifier(s), {bytes} bytes"
    );
    let mut i = 0usize;
    c.bench_function("vswitch/policy/sg_1k_rules", |b| {
        b.iter(|| {
            let k = &probes[i % PROBES];
            i = i.wrapping_add(1);
            black_box(policy.sg_evaluate(black_box(PortId(10)), Direction::Ingress, black_box(k)))
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(std::time::Duration::from_secs(1))
        .measurement_time(std::time::Duration::from_secs(3));
    targets = bench_lpm, bench_sg
}
criterion_main!(benches);
