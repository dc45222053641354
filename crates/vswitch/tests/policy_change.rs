//! What a policy change does to established connections, per tenant (`on_policy_change`). One
//! tenant opens TCP, UDP and ICMP connections between two VMs and a SNATed TCP connection to the
//! internet under a first policy; a second policy removes the rule that admitted the TCP
//! connection, narrows the UDP rule (one of two connections falls outside it), and adds deny
//! rules for the ICMP and internet connections. Under `keep` (the default) every established
//! connection goes on as before; under `recheck` the revoked ones are cut on their next packet,
//! in whichever direction it travels (dropped as `vswitch.drop.policy_revoked`, counted in
//! `vswitch.policy.conn_cut`, SNAT port returned, conntrack entry and flow entries gone), the
//! still-admitted UDP connection survives, and later packets of a cut connection are judged as
//! packets of no connection. Each scenario runs with the fast path on and off, asserting
//! verdicts and counters by name; `common::run` checks the pipeline's invariants after every
//! frame. The last tests cover the config field's validation and state sync: a pipeline that
//! rechecks refuses to adopt a snapshot its policy revokes.

mod common;

use common::*;
use spillway_vswitch::conntrack::CtState;
use spillway_vswitch::pipeline::{AdoptError, Pipeline, PipelineConfig};
use spillway_vswitch::policy::{ConfigError, OnPolicyChange, Policy};
use spillway_vswitch::{DropReason, PortId, TenantId, Verdict};
use spillway_wire::{Decap, FlowKey, MacAddr, ip_proto, parse_frame_decap};
use std::net::Ipv4Addr;

const A: PortId = PortId(10);
const B: PortId = PortId(11);
const A_MAC: MacAddr = MacAddr([2, 0, 0, 1, 0, 0x0a]);
const B_MAC: MacAddr = MacAddr([2, 0, 0, 1, 0, 0x0b]);
const A_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 10);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 11);
const PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
const T: TenantId = TenantId(1);

/// The policy, version 1 or 2, with `mode` as the tenant's `on_policy_change` (omitted when
/// `None`, which means "keep").
fn policy_text(mode: Option<&str>, version: u8) -> String {
    let mode = mode.map_or(String::new(), |m| format!("on_policy_change = \"{m}\""));
    // Version 2: the TCP rule is removed, the UDP rule narrowed to port 53, and A's egress gets
    // deny rules for ICMP to B and for HTTPS to anywhere.
    let (tcp_rule, udp_ports, a_rules) = if version == 1 {
        (
            r#"
[[security_group.rule]]
direction = "ingress"
priority = 100
action = "allow"
protocol = "tcp"
remote = "10.1.0.0/24"
ports = 5432"#,
            "53-54",
            "",
        )
    } else {
        (
            "",
            "53",
            r#"
[[security_group.rule]]
direction = "egress"
priority = 10
action = "deny"
protocol = "icmp"
remote = "10.1.0.11/32"
[[security_group.rule]]
direction = "egress"
priority = 10
action = "deny"
protocol = "tcp"
remote = "0.0.0.0/0"
ports = 443"#,
        )
    };
    format!(
        r#"
[host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"

[[tenant]]
id = 1
vni = 1001
router_mac = "02:00:00:00:01:01"
subnets = ["10.1.0.0/16"]
snat = {{ public_ip = "203.0.113.10", port_min = 1024, port_max = 1100 }}
{mode}
[[tenant.route]]
prefix = "0.0.0.0/0"
target = "internet"

[[port]]
id = 10
tenant = 1
mac = "02:00:00:01:00:0a"
ips = ["10.1.0.10"]
security_groups = [2]

[[port]]
id = 11
tenant = 1
mac = "02:00:00:01:00:0b"
ips = ["10.1.0.11"]
security_groups = [1]

[[security_group]]
id = 1
tenant = 1
{tcp_rule}
[[security_group.rule]]
direction = "ingress"
priority = 100
action = "allow"
protocol = "udp"
remote = "10.1.0.0/24"
ports = "{udp_ports}"
[[security_group.rule]]
direction = "ingress"
priority = 100
action = "allow"
protocol = "icmp"
remote = "10.0.0.0/8"

[[security_group]]
id = 2
tenant = 1
{a_rules}
"#
    )
}

fn policy(mode: Option<&str>, version: u8) -> Policy {
    Policy::from_toml_str(&policy_text(mode, version), "policy_change.toml")
        .expect("the test policy compiles")
}

fn pipelines(mode: Option<&str>) -> [Pipeline; 2] {
    [true, false].map(|fast_path| {
        Pipeline::new(
            policy(mode, 1),
            PipelineConfig {
                fast_path,
                ..PipelineConfig::default()
            },
        )
        .expect("valid pipeline config")
    })
}

fn count(p: &Pipeline, name: &str) -> u64 {
    p.counters()
        .iter()
        .chain(p.drops().iter())
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

fn a_to_b_tcp(flags: u8) -> Vec<u8> {
    tcp(A_MAC, ACME_ROUTER, (A_IP, 40000), (B_IP, 5432), flags, b"")
}

fn b_to_a_tcp(flags: u8) -> Vec<u8> {
    tcp(B_MAC, ACME_ROUTER, (B_IP, 5432), (A_IP, 40000), flags, b"")
}

fn a_to_b_udp(dport: u16) -> Vec<u8> {
    udp(A_MAC, ACME_ROUTER, (A_IP, 5000), (B_IP, dport), b"q")
}

fn b_to_a_udp(sport: u16) -> Vec<u8> {
    udp(B_MAC, ACME_ROUTER, (B_IP, sport), (A_IP, 5000), b"r")
}

fn a_to_internet_tcp(flags: u8) -> Vec<u8> {
    tcp(
        A_MAC,
        ACME_ROUTER,
        (A_IP, 41000),
        (INTERNET_HOST, 443),
        flags,
        b"",
    )
}

fn internet_to_public_tcp(port: u16, flags: u8) -> Vec<u8> {
    tcp(
        GATEWAY_MAC,
        UPLINK_MAC,
        (INTERNET_HOST, 443),
        (PUBLIC, port),
        flags,
        b"",
    )
}

/// Opens every connection under policy 1 and returns the SNAT port of the internet one.
fn open_all(p: &mut Pipeline) -> u16 {
    let fwd = |v| assert!(matches!(v, Verdict::Forward(_)), "{v:?}");
    // TCP A -> B:5432, established.
    fwd(run(p, secs(1), A, &a_to_b_tcp(SYN)).0);
    fwd(run(p, secs(1), B, &b_to_a_tcp(SYN | ACK)).0);
    fwd(run(p, secs(1), A, &a_to_b_tcp(ACK)).0);
    // UDP A -> B:53 and A -> B:54, both answered.
    for port in [53, 54] {
        fwd(run(p, secs(1), A, &a_to_b_udp(port)).0);
        fwd(run(p, secs(1), B, &b_to_a_udp(port)).0);
    }
    // ICMP echo A -> B, answered.
    fwd(run(
        p,
        secs(1),
        A,
        &ping(A_MAC, ACME_ROUTER, A_IP, B_IP, 7, false),
    )
    .0);
    fwd(run(
        p,
        secs(1),
        B,
        &ping(B_MAC, ACME_ROUTER, B_IP, A_IP, 7, true),
    )
    .0);
    // TCP A -> internet:443 through SNAT, established.
    let (v, out, _) = run(p, secs(1), A, &a_to_internet_tcp(SYN));
    fwd(v);
    let nat_port = parse_frame_decap(&out, Decap::Off)
        .expect("parses")
        .outer
        .key
        .expect("IP")
        .src_port;
    fwd(run(
        p,
        secs(1),
        UPLINK,
        &internet_to_public_tcp(nat_port, SYN | ACK),
    )
    .0);
    fwd(run(p, secs(1), A, &a_to_internet_tcp(ACK)).0);
    assert_eq!(p.snat_in_use(T, ip_proto::TCP), 1);
    assert_eq!(p.conntrack().len(), 5);
    nat_port
}

#[test]
fn keep_leaves_every_established_connection_alone() {
    for mode in [None, Some("keep")] {
        for mut p in pipelines(mode) {
            assert_eq!(p.policy().on_policy_change(T), OnPolicyChange::Keep);
            let nat_port = open_all(&mut p);
            p.set_policy(policy(mode, 2));
            let t = secs(2);
            let expect = [
                (A, a_to_b_tcp(ACK), B),
                (B, b_to_a_tcp(ACK), A),
                (A, a_to_b_udp(53), B),
                (A, a_to_b_udp(54), B),
                (B, b_to_a_udp(54), A),
                (A, ping(A_MAC, ACME_ROUTER, A_IP, B_IP, 7, false), B),
                (UPLINK, internet_to_public_tcp(nat_port, ACK), A),
                (A, a_to_internet_tcp(ACK), UPLINK),
            ];
            for (ingress, frame, out) in expect {
                assert_eq!(run(&mut p, t, ingress, &frame).0, Verdict::Forward(out));
            }
            assert_eq!(count(&p, "vswitch.policy.conn_cut"), 0);
            assert_eq!(count(&p, "vswitch.drop.policy_revoked"), 0);
            assert_eq!(p.snat_in_use(T, ip_proto::TCP), 1);
            assert_eq!(p.conntrack().len(), 5);
            // New connections are judged by the new groups: port 5432 is closed now.
            let syn = tcp(A_MAC, ACME_ROUTER, (A_IP, 40001), (B_IP, 5432), SYN, b"");
            assert_eq!(
                run(&mut p, t, A, &syn).0,
                Verdict::Drop(DropReason::SecurityGroupDefaultDeny)
            );
        }
    }
}

#[test]
fn recheck_cuts_revoked_connections_on_their_next_packet_in_either_direction() {
    for mut p in pipelines(Some("recheck")) {
        assert_eq!(p.policy().on_policy_change(T), OnPolicyChange::Recheck);
        let nat_port = open_all(&mut p);
        p.set_policy(policy(Some("recheck"), 2));
        let t = secs(2);
        let revoked = Verdict::Drop(DropReason::PolicyRevoked);

        // Rule removed: the TCP connection's next packet, here from the server's side (its
        // direction was admitted by state), cuts it; the client's next ACK meets no state and
        // is judged as a first packet, which the groups deny now.
        assert_eq!(run(&mut p, t, B, &b_to_a_tcp(ACK)).0, revoked);
        assert_eq!(count(&p, "vswitch.policy.conn_cut"), 1);
        assert_eq!(
            run(&mut p, t, A, &a_to_b_tcp(ACK)).0,
            Verdict::Drop(DropReason::SecurityGroupDefaultDeny)
        );

        // Rule narrowed: port 53 is still admitted, port 54 is cut (by its reply direction).
        assert_eq!(run(&mut p, t, A, &a_to_b_udp(53)).0, Verdict::Forward(B));
        assert_eq!(run(&mut p, t, B, &b_to_a_udp(53)).0, Verdict::Forward(A));
        assert_eq!(run(&mut p, t, B, &b_to_a_udp(54)).0, revoked);
        assert_eq!(count(&p, "vswitch.policy.conn_cut"), 2);
        // Without the connection, A -> B:54 is a new connection the narrowed rule denies.
        assert_eq!(
            run(&mut p, t, A, &a_to_b_udp(54)).0,
            Verdict::Drop(DropReason::SecurityGroupDefaultDeny)
        );

        // Rule added (A may not ping B): the echo connection is cut by B's next reply; a new
        // request meets the deny rule.
        let reply = ping(B_MAC, ACME_ROUTER, B_IP, A_IP, 7, true);
        assert_eq!(run(&mut p, t, B, &reply).0, revoked);
        assert_eq!(count(&p, "vswitch.policy.conn_cut"), 3);
        let request = ping(A_MAC, ACME_ROUTER, A_IP, B_IP, 7, false);
        assert!(matches!(
            run(&mut p, t, A, &request).0,
            Verdict::Drop(DropReason::SecurityGroupDeny { .. })
        ));

        // Rule added (no HTTPS out): the SNATed connection is cut by the internet's next
        // packet, and its SNAT port goes back to the pool.
        assert_eq!(
            run(&mut p, t, UPLINK, &internet_to_public_tcp(nat_port, ACK)).0,
            revoked
        );
        assert_eq!(count(&p, "vswitch.policy.conn_cut"), 4);
        assert_eq!(p.snat_in_use(T, ip_proto::TCP), 0);
        assert_eq!(
            run(&mut p, t, UPLINK, &internet_to_public_tcp(nat_port, ACK)).0,
            Verdict::Drop(DropReason::NoConnection)
        );

        assert_eq!(count(&p, "vswitch.drop.policy_revoked"), 4);
        // Only the UDP connection to port 53 is left, with its two flow entries (fast path on).
        assert_eq!(p.conntrack().len(), 1);
        let left = p.conntrack().iter().next().expect("one").1;
        assert_eq!(left.orig().dst_port, 53);
        assert_eq!(left.state(), CtState::Replied);
        let entries = p.flows().len();
        assert!(entries <= 2, "{entries} flow entries left");
        // Nothing more is cut: the survivor was checked once per packet, not counted.
        assert_eq!(
            run(&mut p, secs(3), A, &a_to_b_udp(53)).0,
            Verdict::Forward(B)
        );
        assert_eq!(count(&p, "vswitch.policy.conn_cut"), 4);
    }
}

#[test]
fn a_connection_cut_under_recheck_stays_cut_when_the_rule_comes_back() {
    // Cut, then the old policy again: the connection is gone, so the client's next ACK meets
    // no state (a new SYN would open it again).
    for mut p in pipelines(Some("recheck")) {
        open_all(&mut p);
        p.set_policy(policy(Some("recheck"), 2));
        assert_eq!(
            run(&mut p, secs(2), A, &a_to_b_tcp(ACK)).0,
            Verdict::Drop(DropReason::PolicyRevoked)
        );
        p.set_policy(policy(Some("recheck"), 1));
        assert_eq!(
            run(&mut p, secs(3), A, &a_to_b_tcp(ACK)).0,
            Verdict::Drop(DropReason::NoConnection)
        );
        assert_eq!(
            run(&mut p, secs(3), A, &a_to_b_tcp(SYN)).0,
            Verdict::Forward(B)
        );
    }
}

#[test]
fn recheck_tenants_are_judged_alone() {
    // The same connections, the same change, but the tenant keeps connections in the new
    // policy: the mode of the policy in force decides, and "keep" cuts nothing.
    for mut p in pipelines(Some("recheck")) {
        open_all(&mut p);
        p.set_policy(policy(Some("keep"), 2));
        assert_eq!(
            run(&mut p, secs(2), A, &a_to_b_tcp(ACK)).0,
            Verdict::Forward(B)
        );
        assert_eq!(count(&p, "vswitch.policy.conn_cut"), 0);
    }
}

#[test]
fn adopt_refuses_a_snapshot_the_current_policy_revokes() {
    // Two planes: `a` owns the connections, `b` holds copies through state sync. `b` reloads
    // first; `a`, still on the old policy, syncs the TCP connection again: `b` refuses it
    // rather than resurrect what its policy revokes. Its own older copy is cut by the next
    // packet, with the verdict the other plane gives once it has reloaded.
    let cfg = PipelineConfig::default();
    let mut a = Pipeline::new(policy(Some("recheck"), 1), cfg.clone()).expect("valid");
    let mut b = Pipeline::new(policy(Some("recheck"), 1), cfg).expect("valid");
    open_all(&mut a);
    let key = FlowKey {
        src_ip: A_IP.into(),
        dst_ip: B_IP.into(),
        src_port: 40000,
        dst_port: 5432,
        proto: ip_proto::TCP,
    };
    let snap = a.export_conn(secs(1), T, &key).expect("tracked");
    let tcp_snap = snap;
    b.adopt_conn(secs(1), &snap)
        .expect("admitted under policy 1");
    b.set_policy(policy(Some("recheck"), 2));
    assert_eq!(b.adopt_conn(secs(2), &snap), Err(AdoptError::Revoked));
    a.set_policy(policy(Some("recheck"), 2));
    for p in [&mut a, &mut b] {
        assert_eq!(
            run(p, secs(2), A, &a_to_b_tcp(ACK)).0,
            Verdict::Drop(DropReason::PolicyRevoked)
        );
        assert!(p.export_conn(secs(2), T, &key).is_none(), "the copy is cut");
        assert_eq!(count(p, "vswitch.policy.conn_cut"), 1);
    }
    // A still-admitted connection is adopted as before.
    let udp53 = FlowKey {
        src_ip: A_IP.into(),
        dst_ip: B_IP.into(),
        src_port: 5000,
        dst_port: 53,
        proto: ip_proto::UDP,
    };
    let snap = a.export_conn(secs(1), T, &udp53).expect("tracked");
    b.adopt_conn(secs(2), &snap).expect("still admitted");
    // Under "keep" the same snapshot is adopted.
    let mut k = Pipeline::new(policy(None, 2), PipelineConfig::default()).expect("valid");
    k.adopt_conn(secs(2), &tcp_snap).expect("keep adopts");
}

#[test]
fn on_policy_change_takes_keep_or_recheck_and_names_the_field_otherwise() {
    let e = Policy::from_toml_str(&policy_text(Some("sometimes"), 1), "p.toml")
        .expect_err("not a mode");
    match &e {
        ConfigError::Invalid {
            file,
            field,
            expected,
            ..
        } => {
            assert_eq!(file, "p.toml");
            assert_eq!(field, "tenant[0].on_policy_change");
            assert!(expected.contains("\"keep\" or \"recheck\""), "{expected}");
        }
        other => panic!("{other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("on_policy_change") && msg.contains("sometimes"),
        "{msg}"
    );
}

#[test]
fn an_icmp_error_related_to_a_revoked_connection_cuts_it_under_recheck_only() {
    for (mode, cut) in [(Some("recheck"), true), (Some("keep"), false)] {
        for mut p in pipelines(mode) {
            open_all(&mut p);
            // B's port-unreachable about A's datagram to port 54: related to that connection.
            let offending = a_to_b_udp(54);
            let err = spillway_wire::build::FrameBuilder::new()
                .eth(B_MAC, ACME_ROUTER)
                .ipv4(B_IP, A_IP)
                .icmp(3, 3)
                .payload(&offending[14..])
                .build();
            assert_eq!(run(&mut p, secs(1), B, &err).0, Verdict::Forward(A));
            p.set_policy(policy(mode, 2));
            let (first, then) = if cut {
                (
                    Verdict::Drop(DropReason::PolicyRevoked),
                    Verdict::Drop(DropReason::IcmpErrorUnrelated),
                )
            } else {
                (Verdict::Forward(A), Verdict::Forward(A))
            };
            assert_eq!(run(&mut p, secs(2), B, &err).0, first);
            assert_eq!(run(&mut p, secs(2), B, &err).0, then);
            assert_eq!(count(&p, "vswitch.policy.conn_cut"), u64::from(cut));
        }
    }
}
