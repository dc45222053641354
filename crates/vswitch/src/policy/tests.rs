//! Policy compilation tests: every validation error class names the file, the field path and
//! what was expected; lookups through a compiled [`Policy`] follow the documented semantics.
//! Each case starts from one valid config and changes one thing.

use super::*;
use crate::verdict::DropReason;

const FILE: &str = "policy.toml";

const BASE: &str = r#"
[host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"

[[tenant]]
id = 1
name = "acme"
vni = 1001
router_mac = "02:00:00:00:01:01"
subnets = ["10.1.0.0/16", "fd00:1::/64"]
snat = { public_ip = "203.0.113.10", port_min = 1024, port_max = 65535 }
[[tenant.route]]
prefix = "10.2.0.0/16"
target = { tunnel = "192.0.2.2" }
[[tenant.route]]
prefix = "0.0.0.0/0"
target = "internet"
[[tenant.route]]
prefix = "10.1.99.0/24"
target = "blackhole"

[[tenant]]
id = 2
name = "globex"
vni = 1002
router_mac = "02:00:00:00:02:01"
subnets = ["10.1.0.0/16"]

[[port]]
id = 10
tenant = 1
mac = "02:00:00:01:00:0a"
ips = ["10.1.0.10", "fd00:1::10"]
security_groups = [1, 2]

[[port]]
id = 11
tenant = 1
mac = "02:00:00:01:00:0b"
ips = ["10.1.0.11"]
security_groups = [1, 2]

[[port]]
id = 20
tenant = 2
mac = "02:00:00:02:00:0a"
ips = ["10.1.0.10"]
security_groups = []

[[security_group]]
id = 1
tenant = 1
[[security_group.rule]]
direction = "ingress"
priority = 100
action = "allow"
protocol = "tcp"
remote = "0.0.0.0/0"
ports = "80"
[[security_group.rule]]
direction = "ingress"
priority = 50
action = "deny"
protocol = "tcp"
remote = "198.51.100.0/24"
ports = "1-1000"
[[security_group.rule]]
direction = "egress"
priority = 10
action = "deny"
protocol = "udp"
remote = "0.0.0.0/0"
ports = 53

[[security_group]]
id = 2
tenant = 1
[[security_group.rule]]
direction = "ingress"
priority = 100
action = "deny"
protocol = "any"
remote = "::/0"
[[security_group.rule]]
direction = "ingress"
priority = 100
action = "deny"
protocol = "tcp"
remote = "0.0.0.0/0"
ports = "80"
[[security_group.rule]]
direction = "ingress"
priority = 200
action = "allow"
protocol = "icmp"
remote = "0.0.0.0/0"
"#;

fn base() -> Policy {
    Policy::from_toml_str(BASE, FILE).expect("base config is valid")
}

fn ip(s: &str) -> IpAddr16 {
    s.parse().expect("test address")
}

/// Replace the first occurrence of `from` in BASE (which must occur) and compile.
fn err_with(from: &str, to: &str) -> ConfigError {
    assert!(BASE.contains(from), "BASE contains {from:?}");
    let text = BASE.replacen(from, to, 1);
    Policy::from_toml_str(&text, FILE).expect_err("mutated config must be rejected")
}

/// Assert the message names the file, the field and the expectation.
fn assert_msg(e: &ConfigError, field: &str, expected: &str) {
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("{FILE}: {field}: expected ")),
        "{msg}"
    );
    assert!(msg.contains(expected), "{msg} lacks {expected:?}");
    assert_eq!(e.field(), Some(field));
}

#[test]
fn base_config_compiles() {
    let p = base();
    assert_eq!(p.tenants().len(), 2);
    assert_eq!(p.ports().len(), 3);
    assert_eq!(p.host().vxlan_port, 4789);
    assert_eq!(p.host().vtep_ip, ip("192.0.2.1"));
    // Ports 10 and 11 share one classifier; port 20 (no groups) has its own.
    assert_eq!(p.sg_memory().0, 2);
}

#[test]
fn toml_syntax_error_names_file_and_line() {
    let text = BASE.replacen("vni = 1001", "vni = = 1001", 1);
    let e = Policy::from_toml_str(&text, FILE).expect_err("syntax error");
    let ConfigError::Toml { line, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*line, 11, "{e}");
    assert!(e.to_string().starts_with("policy.toml:11:7:"), "{e}");
}

#[test]
fn unknown_field_is_rejected_with_its_line() {
    let text = BASE.replacen("name = \"acme\"", "name = \"acme\"\ncolour = \"red\"", 1);
    let e = Policy::from_toml_str(&text, FILE).expect_err("unknown field");
    let msg = e.to_string();
    assert!(
        msg.starts_with("policy.toml:11:1: tenant[0].colour: "),
        "{msg}"
    );
    assert!(msg.contains("unknown field `colour`"), "{msg}");
    assert_eq!(e.field(), Some("tenant[0].colour"));
}

#[test]
fn wrong_type_is_a_toml_error() {
    let e = err_with("vni = 1001", "vni = \"1001\"");
    assert!(matches!(e, ConfigError::Toml { line: 11, .. }), "{e}");
    assert_eq!(e.field(), Some("tenant[0].vni"));
    assert!(e.to_string().contains("expected u32"), "{e}");
}

#[test]
fn toml_errors_in_nested_arrays_name_the_indexed_path() {
    let e = err_with("target = \"internet\"", "target = \"moon\"");
    assert_eq!(e.field(), Some("tenant[0].route[1].target"), "{e}");
    assert!(e.to_string().contains("unknown variant `moon`"), "{e}");
    let e = err_with("direction = \"egress\"", "direction = \"sideways\"");
    assert_eq!(
        e.field(),
        Some("security_group[0].rule[2].direction"),
        "{e}"
    );
    let e = err_with("vni = 1002", "vni = 1002\nbogus = 1");
    assert_eq!(e.field(), Some("tenant[1].bogus"), "{e}");
    let e = err_with("gateway_mac", "gateway_mac_typo = 1\ngateway_mac");
    assert_eq!(e.field(), Some("host.gateway_mac_typo"), "{e}");
}

#[test]
fn bad_mac_message_is_exact() {
    let e = err_with("mac = \"02:00:00:01:00:0b\"", "mac = \"zz\"");
    assert_eq!(
        e.to_string(),
        "policy.toml: port[1].mac: expected a MAC address like 02:00:00:00:00:01, got \"zz\""
    );
}

#[test]
fn multicast_port_mac_is_rejected() {
    let e = err_with("mac = \"02:00:00:01:00:0a\"", "mac = \"01:00:5e:00:00:01\"");
    assert_msg(&e, "port[0].mac", "unicast");
}

#[test]
fn port_macs_are_unique_and_not_the_hosts_or_a_routers() {
    let e = err_with("mac = \"02:00:00:01:00:0b\"", "mac = \"02:00:00:01:00:0a\"");
    assert_msg(&e, "port[1].mac", "a unique MAC address");
    assert!(
        e.to_string().contains("which port[0].mac already has"),
        "{e}"
    );
    let e = err_with("mac = \"02:00:00:02:00:0a\"", "mac = \"02:00:00:01:00:0a\"");
    assert_msg(&e, "port[2].mac", "which port[0].mac already has");
    let e = err_with("mac = \"02:00:00:01:00:0a\"", "mac = \"02:00:00:00:00:01\"");
    assert_msg(&e, "port[0].mac", "which host.uplink_mac already has");
    let e = err_with("mac = \"02:00:00:01:00:0a\"", "mac = \"02:00:00:00:00:fe\"");
    assert_msg(&e, "port[0].mac", "which host.gateway_mac already has");
    let e = err_with("mac = \"02:00:00:01:00:0a\"", "mac = \"02:00:00:00:02:01\"");
    assert_msg(
        &e,
        "port[0].mac",
        "which the router_mac of tenant 2 already has",
    );
}

#[test]
fn zero_and_broadcast_macs_are_rejected() {
    let e = err_with("mac = \"02:00:00:01:00:0a\"", "mac = \"00:00:00:00:00:00\"");
    assert_msg(&e, "port[0].mac", "other than 00:00:00:00:00:00");
    let e = err_with("mac = \"02:00:00:01:00:0a\"", "mac = \"ff:ff:ff:ff:ff:ff\"");
    assert_msg(&e, "port[0].mac", "unicast");
    let e = err_with(
        "uplink_mac = \"02:00:00:00:00:01\"",
        "uplink_mac = \"00:00:00:00:00:00\"",
    );
    assert_msg(&e, "host.uplink_mac", "other than 00:00:00:00:00:00");
}

#[test]
fn errors_echo_a_bounded_part_of_the_input() {
    let huge = "x".repeat(200_000);
    let e = err_with("mac = \"02:00:00:01:00:0a\"", &format!("mac = \"{huge}\""));
    let msg = e.to_string();
    assert!(msg.len() < 300, "{} bytes: {}", msg.len(), &msg[..300]);
    assert!(msg.contains("… (200000 bytes in all)"), "{msg}");
    // A type error quotes the value in serde's message: bounded too.
    let e = err_with("vni = 1001", &format!("vni = \"{huge}\""));
    assert!(e.to_string().len() < 400, "{}", &e.to_string()[..400]);
}

#[test]
fn bad_addresses_and_prefixes_name_their_field() {
    assert_msg(
        &err_with("vtep_ip = \"192.0.2.1\"", "vtep_ip = \"192.0.2\""),
        "host.vtep_ip",
        "an IPv4 or IPv6 address",
    );
    assert_msg(
        &err_with("prefix = \"0.0.0.0/0\"", "prefix = \"0.0.0.0\""),
        "tenant[0].route[1].prefix",
        "a CIDR prefix",
    );
    assert_msg(
        &err_with("\"fd00:1::/64\"", "\"fd00:1::/129\""),
        "tenant[0].subnets[1]",
        "prefix length",
    );
    assert_msg(
        &err_with(
            "remote = \"198.51.100.0/24\"",
            "remote = \"198.51.100.0/40\"",
        ),
        "security_group[0].rule[1].remote",
        "prefix length",
    );
    assert_msg(
        &err_with("tunnel = \"192.0.2.2\"", "tunnel = \"nope\""),
        "tenant[0].route[0].target.tunnel",
        "address",
    );
    assert_msg(
        &err_with("public_ip = \"203.0.113.10\"", "public_ip = \"x\""),
        "tenant[0].snat.public_ip",
        "address",
    );
}

#[test]
fn host_bits_in_prefixes_are_normalised() {
    let text = BASE.replacen(
        "\"10.1.0.0/16\", \"fd00:1::/64\"",
        "\"10.1.7.7/16\", \"fd00:1::1/64\"",
        1,
    );
    let p = Policy::from_toml_str(&text, FILE).expect("host bits allowed");
    let t = p.tenant(TenantId(1)).expect("tenant 1");
    assert_eq!(t.subnets[0].to_string(), "10.1.0.0/16");
    assert_eq!(t.subnets[1].to_string(), "fd00:1::/64");
}

#[test]
fn duplicate_ids_are_rejected() {
    assert_msg(
        &err_with("id = 2\nname", "id = 1\nname"),
        "tenant[1].id",
        "a unique tenant id",
    );
    assert_msg(
        &err_with("id = 11", "id = 10"),
        "port[1].id",
        "a unique port id",
    );
    assert_msg(
        &err_with("id = 2\ntenant = 1", "id = 1\ntenant = 1"),
        "security_group[1].id",
        "a unique security group id",
    );
    let e = err_with("id = 11", "id = 10");
    assert!(e.to_string().contains("port[0].id already has"), "{e}");
}

#[test]
fn uplink_port_id_is_reserved() {
    assert_msg(
        &err_with("uplink_port = 0", "uplink_port = 20"),
        "port[2].id",
        "a unique port id",
    );
}

#[test]
fn duplicate_and_oversized_vnis_are_rejected() {
    assert_msg(
        &err_with("vni = 1002", "vni = 1001"),
        "tenant[1].vni",
        "a unique VNI",
    );
    assert_msg(
        &err_with("vni = 1002", "vni = 16777216"),
        "tenant[1].vni",
        "at most 16777215",
    );
    let ok = BASE.replacen("vni = 1002", "vni = 16777215", 1);
    assert!(Policy::from_toml_str(&ok, FILE).is_ok());
}

#[test]
fn unknown_references_are_rejected() {
    assert_msg(
        &err_with("tenant = 2\nmac", "tenant = 9\nmac"),
        "port[2].tenant",
        "a defined tenant",
    );
    assert_msg(
        &err_with("security_groups = [1, 2]", "security_groups = [1, 7]"),
        "port[0].security_groups[1]",
        "security group of tenant 1",
    );
    // Group 1 exists but belongs to tenant 1, not port 20's tenant 2.
    assert_msg(
        &err_with("security_groups = []", "security_groups = [1]"),
        "port[2].security_groups[0]",
        "security group of tenant 2",
    );
    assert_msg(
        &err_with("id = 2\ntenant = 1", "id = 2\ntenant = 5"),
        "security_group[1].tenant",
        "a defined tenant",
    );
    assert_msg(
        &err_with("security_groups = [1, 2]", "security_groups = [1, 1]"),
        "port[0].security_groups[1]",
        "a unique security group in the list",
    );
}

#[test]
fn router_addresses_default_to_the_first_host_of_each_subnet() {
    let p = base();
    let t = p.tenant(TenantId(1)).expect("acme");
    assert_eq!(t.router_ips, vec![ip("10.1.0.1"), ip("fd00:1::1")]);
    // A /31 or /128 has no "first host" to spare: no default router address there.
    let text = BASE.replacen(
        "subnets = [\"10.1.0.0/16\", \"fd00:1::/64\"]",
        "subnets = [\"10.1.0.0/16\", \"10.3.0.0/31\", \"fd00:1::/64\", \"fd00:9::1/128\"]",
        1,
    );
    let p = Policy::from_toml_str(&text, FILE).expect("valid");
    assert_eq!(
        p.tenant(TenantId(1)).expect("acme").router_ips,
        vec![ip("10.1.0.1"), ip("fd00:1::1")]
    );
}

#[test]
fn configured_router_addresses_are_checked() {
    let subnets = "subnets = [\"10.1.0.0/16\", \"fd00:1::/64\"]";
    let with = |list: &str| format!("{subnets}\nrouter_ips = {list}");
    let p = Policy::from_toml_str(
        &BASE.replacen(subnets, &with("[\"10.1.255.254\"]"), 1),
        FILE,
    )
    .expect("valid");
    assert_eq!(
        p.tenant(TenantId(1)).expect("acme").router_ips,
        vec![ip("10.1.255.254")]
    );
    let e = err_with(subnets, &with("[\"10.9.0.1\"]"));
    assert_msg(
        &e,
        "tenant[0].router_ips[0]",
        "inside tenant 1's subnets [10.1.0.0/16, fd00:1::/64]",
    );
    assert!(e.to_string().ends_with("got 10.9.0.1"), "{e}");
    assert_msg(
        &err_with(subnets, &with("[\"10.1.0.1\", \"10.1.0.1\"]")),
        "tenant[0].router_ips[1]",
        "a unique router address",
    );
    assert_msg(
        &err_with(subnets, &with("[\"gateway\"]")),
        "tenant[0].router_ips[0]",
        "an IPv4 or IPv6 address",
    );
}

#[test]
fn port_address_outside_tenant_subnets_is_rejected() {
    let e = err_with("ips = [\"10.1.0.11\"]", "ips = [\"10.9.0.11\"]");
    assert_msg(
        &e,
        "port[1].ips[0]",
        "inside tenant 1's subnets [10.1.0.0/16, fd00:1::/64]",
    );
    assert!(e.to_string().ends_with("got 10.9.0.11"), "{e}");
    // An IPv6 address is not inside an IPv4 subnet of the same bits.
    assert_msg(
        &err_with("ips = [\"10.1.0.10\"]", "ips = [\"fd00:1::10\"]"),
        "port[2].ips[0]",
        "inside tenant 2's subnets",
    );
}

#[test]
fn duplicate_address_within_a_tenant_is_rejected_but_not_across_tenants() {
    let e = err_with("ips = [\"10.1.0.11\"]", "ips = [\"10.1.0.10\"]");
    assert_msg(&e, "port[1].ips[0]", "a unique address within the tenant");
    assert!(e.to_string().contains("port[0].ips[0]"), "{e}");
    // Port 20 in tenant 2 already reuses 10.1.0.10 in BASE.
    assert_eq!(
        base().port_by_ip(TenantId(2), ip("10.1.0.10")),
        Some(PortId(20))
    );
}

#[test]
fn snat_range_and_address_are_checked() {
    assert_msg(
        &err_with(
            "port_min = 1024, port_max = 65535",
            "port_min = 2000, port_max = 1999",
        ),
        "tenant[0].snat.port_min",
        "a port in 1..=port_max (1999)",
    );
    // Port 0 is no source port: a pool starting there is a mistake, not a choice.
    assert_msg(
        &err_with("port_min = 1024", "port_min = 0"),
        "tenant[0].snat.port_min",
        "a port in 1..=port_max (65535)",
    );
    let text = BASE.replacen(
        "subnets = [\"10.1.0.0/16\"]\n",
        "subnets = [\"10.1.0.0/16\"]\nsnat = { public_ip = \"203.0.113.10\" }\n",
        1,
    );
    let e = Policy::from_toml_str(&text, FILE).expect_err("duplicate SNAT address");
    assert_msg(&e, "tenant[1].snat.public_ip", "a unique SNAT address");
}

#[test]
fn duplicate_prefixes_within_a_tenant_are_rejected() {
    assert_msg(
        &err_with("prefix = \"10.2.0.0/16\"", "prefix = \"10.1.0.0/16\""),
        "tenant[0].route[0].prefix",
        "a unique prefix",
    );
}

#[test]
fn rule_protocol_and_ports_are_checked() {
    assert_msg(
        &err_with("protocol = \"icmp\"", "protocol = \"gre\""),
        "security_group[1].rule[2].protocol",
        "tcp, udp, icmp, icmpv6, any or a protocol number",
    );
    assert_msg(
        &err_with("protocol = \"icmp\"", "protocol = 300"),
        "security_group[1].rule[2].protocol",
        "protocol number 0-255",
    );
    assert_msg(
        &err_with("ports = \"1-1000\"", "ports = \"1000-1\""),
        "security_group[0].rule[1].ports",
        "low <= high",
    );
    assert_msg(
        &err_with("ports = 53", "ports = 70000"),
        "security_group[0].rule[2].ports",
        "a port 0-65535",
    );
    assert_msg(
        &err_with("protocol = \"icmp\"", "protocol = \"icmp\"\nports = \"8\""),
        "security_group[1].rule[2].ports",
        "no ports unless protocol is tcp or udp",
    );
    // A protocol number is accepted.
    let ok = BASE.replacen("protocol = \"icmp\"", "protocol = 47", 1);
    assert!(Policy::from_toml_str(&ok, FILE).is_ok());
}

#[test]
fn too_many_rules_on_a_port_is_rejected() {
    let mut cfg: PolicyConfig = toml::from_str(BASE).expect("base parses");
    let rule = cfg.security_groups[0].rules[0].clone();
    cfg.security_groups[0].rules = vec![rule; RULES_PER_PORT_MAX];
    let e = Policy::compile(cfg, FILE).expect_err("over the limit");
    assert_msg(&e, "port[0].security_groups", "at most 2048 rules");
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let e = Policy::load(std::path::Path::new("/nonexistent/policy.toml")).expect_err("missing");
    assert!(
        e.to_string()
            .starts_with("/nonexistent/policy.toml: cannot read"),
        "{e}"
    );
}

#[test]
fn lookups_by_id_vni_ip_and_snat_address() {
    let p = base();
    let t = p.tenant(TenantId(1)).expect("tenant 1");
    assert_eq!(t.name, "acme");
    assert_eq!(t.vni.get(), 1001);
    assert_eq!(t.snat.map(|s| s.public_ip), Some(ip("203.0.113.10")));
    assert_eq!(
        p.tenant_by_vni(Vni::new(1002).expect("vni")),
        Some(TenantId(2))
    );
    assert_eq!(p.tenant_by_vni(Vni::new(7).expect("vni")), None);
    assert_eq!(p.port(PortId(10)).map(|x| x.tenant), Some(TenantId(1)));
    assert_eq!(p.port(PortId(0)), None, "the uplink is not a VM port");
    assert_eq!(
        p.port_by_ip(TenantId(1), ip("fd00:1::10")),
        Some(PortId(10))
    );
    assert_eq!(p.port_by_ip(TenantId(1), ip("10.1.0.12")), None);
    assert_eq!(p.is_snat_address(ip("203.0.113.10")), Some(TenantId(1)));
    assert_eq!(p.is_snat_address(ip("203.0.113.11")), None);
    assert_eq!(
        p.security_group(SecurityGroupId(2)).map(|g| g.rules.len()),
        Some(3)
    );
}

#[test]
fn routes_use_longest_prefix_with_subnets_local() {
    let p = base();
    let t = TenantId(1);
    assert_eq!(p.route(t, ip("10.1.2.3")), Some(RouteTarget::Local));
    assert_eq!(p.route(t, ip("10.1.99.3")), Some(RouteTarget::Blackhole));
    assert_eq!(
        p.route(t, ip("10.2.0.1")),
        Some(RouteTarget::Tunnel {
            vtep: ip("192.0.2.2")
        })
    );
    assert_eq!(p.route(t, ip("8.8.8.8")), Some(RouteTarget::Internet));
    assert_eq!(p.route(t, ip("fd00:1::99")), Some(RouteTarget::Local));
    // No IPv6 default route: IPv4's 0.0.0.0/0 never catches IPv6.
    assert_eq!(p.route(t, ip("2001:db8::1")), None);
    // Tenant 2 has no default route; unknown tenants have no routes.
    assert_eq!(p.route(TenantId(2), ip("8.8.8.8")), None);
    assert_eq!(p.route(TenantId(9), ip("10.1.0.1")), None);
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
fn security_groups_follow_precedence_across_groups() {
    let p = base();
    let port = PortId(10);
    let http = flow("192.0.2.50", "10.1.0.10", ip_proto::TCP, 80);
    // Priority 100 ties: group 1 rule 0 (allow) beats group 2 rule 1 (deny) by group id.
    assert_eq!(
        p.sg_evaluate(port, Direction::Ingress, &http),
        SgDecision::Allow {
            group: SecurityGroupId(1),
            rule: 0
        }
    );
    // Priority 50 deny wins over the allow for this source range.
    let from_bad = flow("198.51.100.9", "10.1.0.10", ip_proto::TCP, 80);
    let d = p.sg_evaluate(port, Direction::Ingress, &from_bad);
    assert_eq!(
        d,
        SgDecision::Deny {
            group: SecurityGroupId(1),
            rule: 1
        }
    );
    assert_eq!(
        d.drop_reason(),
        Some(DropReason::SecurityGroupDeny {
            group: SecurityGroupId(1),
            rule: 1
        })
    );
    // ICMP of any type is allowed by group 2 rule 2.
    let ping = flow("192.0.2.50", "10.1.0.10", ip_proto::ICMP, 0x0800);
    assert!(p.sg_evaluate(port, Direction::Ingress, &ping).is_allow());
    // IPv6 ingress hits group 2's any-protocol deny.
    let v6 = flow("2001:db8::1", "fd00:1::10", ip_proto::UDP, 9);
    assert_eq!(
        p.sg_evaluate(port, Direction::Ingress, &v6),
        SgDecision::Deny {
            group: SecurityGroupId(2),
            rule: 0
        }
    );
}

#[test]
fn security_group_defaults_deny_ingress_allow_egress() {
    let p = base();
    let ssh = flow("192.0.2.50", "10.1.0.10", ip_proto::TCP, 22);
    assert_eq!(
        p.sg_evaluate(PortId(10), Direction::Ingress, &ssh),
        SgDecision::DefaultDeny
    );
    let out = flow("10.1.0.10", "192.0.2.50", ip_proto::TCP, 443);
    assert_eq!(
        p.sg_evaluate(PortId(10), Direction::Egress, &out),
        SgDecision::DefaultAllow
    );
    let dns = flow("10.1.0.10", "192.0.2.53", ip_proto::UDP, 53);
    assert_eq!(
        p.sg_evaluate(PortId(10), Direction::Egress, &dns),
        SgDecision::Deny {
            group: SecurityGroupId(1),
            rule: 2
        }
    );
    // A port with no groups gets only the defaults; an unknown port is denied both ways.
    assert_eq!(
        p.sg_evaluate(PortId(20), Direction::Egress, &out),
        SgDecision::DefaultAllow
    );
    assert_eq!(
        p.sg_evaluate(PortId(99), Direction::Egress, &out),
        SgDecision::DefaultDeny
    );
}

#[test]
fn compiled_classifier_agrees_with_linear_scan_on_the_base_config() {
    let p = base();
    let rules: Vec<SgRule> = [1, 2]
        .iter()
        .flat_map(|&g| {
            p.security_group(SecurityGroupId(g))
                .expect("group")
                .rules
                .clone()
        })
        .collect();
    let srcs = ["192.0.2.50", "198.51.100.9", "10.1.0.11"];
    for src in srcs {
        for proto in [ip_proto::TCP, ip_proto::UDP, ip_proto::ICMP, 47] {
            for dport in [0u16, 1, 53, 80, 1000, 1001, 65535] {
                for dir in [Direction::Ingress, Direction::Egress] {
                    let k = match dir {
                        Direction::Ingress => flow(src, "10.1.0.10", proto, dport),
                        Direction::Egress => flow("10.1.0.10", src, proto, dport),
                    };
                    assert_eq!(
                        p.sg_evaluate(PortId(10), dir, &k),
                        sg::reference_evaluate(&rules, dir, &k),
                        "{dir:?} {k}"
                    );
                }
            }
        }
    }
}

#[test]
fn config_built_in_code_compiles() {
    let cfg = PolicyConfig {
        host: HostSection {
            uplink_port: 0,
            uplink_mac: "02:00:00:00:00:01".into(),
            vtep_ip: "2001:db8::1".into(),
            gateway_mac: "02:00:00:00:00:fe".into(),
            vxlan_port: 4789,
            underlay_mtu: None,
        },
        tenants: vec![TenantSection {
            id: 3,
            name: "code".into(),
            vni: 3,
            router_mac: "02:00:00:00:03:01".into(),
            subnets: vec!["fd00:3::/48".into()],
            snat: None,
            router_ips: None,
            routes: vec![RouteSection {
                prefix: "::/0".into(),
                target: RouteTargetSection::Tunnel("2001:db8::2".into()),
            }],
            on_policy_change: None,
        }],
        ports: vec![],
        security_groups: vec![],
    };
    let p = Policy::compile(cfg, "<code>").expect("valid");
    assert_eq!(
        p.route(TenantId(3), ip("2001:db8:ffff::1")),
        Some(RouteTarget::Tunnel {
            vtep: ip("2001:db8::2")
        })
    );
    assert_eq!(
        p.route(TenantId(3), ip("fd00:3::1")),
        Some(RouteTarget::Local)
    );
}

#[test]
fn policy_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Policy>();
}

mod differential {
    //! `Policy::route` through the whole compile path (strings parsed, host bits cleared,
    //! subnets added as local) against the linear-scan oracle over the compiled tenant's
    //! subnets and routes.
    use super::*;
    use proptest::prelude::*;

    fn arb_route() -> impl Strategy<Value = (String, u8)> {
        (any::<[u8; 4]>(), 0u8..=32, 0u8..4)
            .prop_map(|(o, len, t)| (format!("10.{}.{}.{}/{len}", o[1] & 7, o[2], o[3]), t))
    }

    proptest! {
        #[test]
        fn policy_route_matches_linear_scan(
            routes in proptest::collection::vec(arb_route(), 0..40),
            probes in proptest::collection::vec(any::<[u8; 4]>(), 1..40),
        ) {
            let mut cfg: PolicyConfig = toml::from_str(BASE).expect("base parses");
            let mut seen = std::collections::BTreeSet::new();
            cfg.tenants[1].routes.clear();
            for (prefix, t) in routes {
                let p: Prefix = prefix.parse().expect("generated prefix");
                if p == "10.1.0.0/16".parse().expect("subnet") || !seen.insert(p) {
                    continue;
                }
                let target = match t {
                    0 => RouteTargetSection::Local,
                    1 => RouteTargetSection::Internet,
                    2 => RouteTargetSection::Blackhole,
                    _ => RouteTargetSection::Tunnel("192.0.2.9".into()),
                };
                cfg.tenants[1].routes.push(RouteSection { prefix, target });
            }
            let policy = Policy::compile(cfg, FILE).expect("valid");
            let tenant = policy.tenant(TenantId(2)).expect("tenant 2");
            let entries: Vec<(Prefix, RouteTarget)> = tenant
                .subnets
                .iter()
                .map(|&p| (p, RouteTarget::Local))
                .chain(tenant.routes.iter().map(|r| (r.prefix, r.target)))
                .collect();
            for o in probes {
                let dst = IpAddr16::from_v4([10, o[1] & 7, o[2], o[3]]);
                prop_assert_eq!(
                    policy.route(TenantId(2), dst),
                    lpm::reference_lookup(&entries, dst)
                );
            }
        }
    }
}

#[test]
fn mtus_default_to_1500_and_are_range_checked_with_ipv6_in_mind() {
    let p = base();
    assert_eq!(p.host().underlay_mtu, 1500);
    assert_eq!(p.host().overlay_mtu(), 1450);
    assert!(p.ports().iter().all(|port| port.mtu == 1500));
    // A jumbo underlay and a small IPv4-only port.
    let text = BASE
        .replacen(
            "gateway_mac = \"02:00:00:00:00:fe\"",
            "gateway_mac = \"02:00:00:00:00:fe\"\nunderlay_mtu = 9000",
            1,
        )
        .replacen(
            "ips = [\"10.1.0.11\"]",
            "ips = [\"10.1.0.11\"]\nmtu = 576",
            1,
        );
    let p = Policy::from_toml_str(&text, FILE).expect("valid");
    assert_eq!(p.host().overlay_mtu(), 8950);
    assert_eq!(p.port(PortId(11)).map(|port| port.mtu), Some(576));
    // Out of range.
    let e = err_with(
        "gateway_mac = \"02:00:00:00:00:fe\"",
        "gateway_mac = \"02:00:00:00:00:fe\"\nunderlay_mtu = 9217",
    );
    assert_eq!(e.field(), Some("host.underlay_mtu"), "{e}");
    assert!(e.to_string().contains("576..=9216"), "{e}");
    // Acme has an IPv6 subnet: its 1280-byte packets must fit the overlay.
    let e = err_with(
        "gateway_mac = \"02:00:00:00:00:fe\"",
        "gateway_mac = \"02:00:00:00:00:fe\"\nunderlay_mtu = 1300",
    );
    assert_eq!(e.field(), Some("host.underlay_mtu"), "{e}");
    assert!(e.to_string().contains("at least 1330"), "{e}");
    // Port 10 has an IPv6 address, so at least 1280.
    let e = err_with(
        "ips = [\"10.1.0.10\", \"fd00:1::10\"]",
        "ips = [\"10.1.0.10\", \"fd00:1::10\"]\nmtu = 1279",
    );
    assert_eq!(e.field(), Some("port[0].mtu"), "{e}");
    assert!(
        e.to_string()
            .contains("1280..=9216 (the port has an IPv6 address)"),
        "{e}"
    );
    let e = err_with("ips = [\"10.1.0.11\"]", "ips = [\"10.1.0.11\"]\nmtu = 67");
    assert_eq!(e.field(), Some("port[1].mtu"), "{e}");
}
