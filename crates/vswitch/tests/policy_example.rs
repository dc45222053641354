//! Proves that the shipped example `examples/policy-basic.toml` loads through the public API and
//! means what its comments say: it is loaded from disk with `Policy::load`, then routes, port and
//! VNI lookups, SNAT addresses and security-group decisions are checked against the file's intent.

use spillway_vswitch::policy::{Policy, RouteTarget, SgDecision, SnatPools};
use spillway_vswitch::{Direction, PortId, SecurityGroupId, TenantId};
use spillway_wire::{FlowKey, IpAddr16, Vni, ip_proto};
use std::path::Path;

fn example() -> Policy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/policy-basic.toml");
    Policy::load(&path).unwrap_or_else(|e| panic!("example loads: {e}"))
}

fn ip(s: &str) -> IpAddr16 {
    s.parse().expect("test address")
}

fn flow(src: &str, dst: &str, proto: u8, dport: u16) -> FlowKey {
    FlowKey {
        src_ip: ip(src),
        dst_ip: ip(dst),
        src_port: 40000,
        dst_port: dport,
        proto,
    }
}

#[test]
fn example_policy_loads_and_indexes_everything() {
    let p = example();
    assert_eq!(p.tenants().len(), 2);
    assert_eq!(p.ports().len(), 4);
    assert_eq!(p.host().vtep_ip, ip("192.0.2.1"));
    assert_eq!(
        p.tenant_by_vni(Vni::new(1002).expect("vni")),
        Some(TenantId(2))
    );
    assert_eq!(p.port_by_ip(TenantId(1), ip("10.1.0.10")), Some(PortId(10)));
    assert_eq!(p.port_by_ip(TenantId(2), ip("10.1.0.10")), Some(PortId(20)));
    assert_eq!(p.is_snat_address(ip("203.0.113.20")), Some(TenantId(2)));
    // Ports 10 and 11 share a group list, so three classifiers serve four ports.
    assert_eq!(p.sg_memory().0, 3);
}

#[test]
fn example_routes_follow_the_file() {
    let p = example();
    let acme = TenantId(1);
    assert_eq!(p.route(acme, ip("10.1.1.20")), Some(RouteTarget::Local));
    assert_eq!(
        p.route(acme, ip("10.1.255.7")),
        Some(RouteTarget::Blackhole)
    );
    assert_eq!(
        p.route(acme, ip("10.2.3.4")),
        Some(RouteTarget::Tunnel {
            vtep: ip("192.0.2.2")
        })
    );
    assert_eq!(
        p.route(acme, ip("fd00:2::5")),
        Some(RouteTarget::Tunnel {
            vtep: ip("192.0.2.2")
        })
    );
    assert_eq!(
        p.route(acme, ip("93.184.216.34")),
        Some(RouteTarget::Internet)
    );
    assert_eq!(p.route(acme, ip("2001:db8::1")), None);
}

#[test]
fn example_security_groups_follow_the_file() {
    let p = example();
    let web = PortId(10);
    let db = PortId(12);
    let https = flow("93.184.216.34", "10.1.0.10", ip_proto::TCP, 443);
    assert!(p.sg_evaluate(web, Direction::Ingress, &https).is_allow());
    let bad = flow("198.51.100.1", "10.1.0.10", ip_proto::TCP, 443);
    assert_eq!(
        p.sg_evaluate(web, Direction::Ingress, &bad),
        SgDecision::Deny {
            group: SecurityGroupId(3),
            rule: 0
        }
    );
    let pg_from_web = flow("10.1.0.10", "10.1.1.20", ip_proto::TCP, 5432);
    assert!(
        p.sg_evaluate(db, Direction::Ingress, &pg_from_web)
            .is_allow()
    );
    let pg_from_internet = flow("93.184.216.34", "10.1.1.20", ip_proto::TCP, 5432);
    assert_eq!(
        p.sg_evaluate(db, Direction::Ingress, &pg_from_internet),
        SgDecision::DefaultDeny
    );
    let db_to_internet = flow("10.1.1.20", "93.184.216.34", ip_proto::TCP, 443);
    assert_eq!(
        p.sg_evaluate(db, Direction::Egress, &db_to_internet),
        SgDecision::Deny {
            group: SecurityGroupId(2),
            rule: 2
        }
    );
    let ping6 = flow("2001:db8::9", "fd00:1::10", ip_proto::ICMPV6, 0x8000);
    assert!(p.sg_evaluate(web, Direction::Ingress, &ping6).is_allow());
}

#[test]
fn example_snat_range_sizes_the_pools() {
    let p = example();
    let range = p
        .tenant(TenantId(2))
        .and_then(|t| t.snat)
        .expect("globex has SNAT");
    let mut pools = SnatPools::new(&range);
    let tcp = pools.for_protocol(ip_proto::TCP).expect("tcp pool");
    assert_eq!(tcp.capacity(), 10_000);
    assert_eq!(tcp.allocate(), Ok(20000));
}

#[test]
fn tunnel_vtep_of_the_other_family_than_the_host_is_rejected() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/policy-basic.toml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.replacen(
        "target = { tunnel = \"192.0.2.2\" }",
        "target = { tunnel = \"2001:db8::2\" }",
        1,
    );
    let err = spillway_vswitch::policy::Policy::from_toml_str(&text, "mixed.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("mixed.toml: tenant[0].route[0].target.tunnel: expected an IPv4 VTEP"),
        "{err}"
    );
}
