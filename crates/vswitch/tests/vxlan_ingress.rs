//! VXLAN is decapsulated only where it belongs: on the uplink, for this host's VTEP address.
//! UDP to port 4789 between two VMs, or from a VM to the internet, is the tenant's own traffic
//! (a tenant may run its own overlay, or just pick that port): it is forwarded or denied by the
//! security groups like any UDP, whatever its payload looks like, and SNAT rewrites only its
//! headers, never bytes of a payload that happens to look like an inner frame. Each test drives
//! real frames through `Pipeline::process` with the fast path on and off and asserts verdicts,
//! bytes and counters by name; `common::run` checks the pipeline's invariants after every frame.

mod common;

use common::*;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{DropKind, DropReason, PortId, Verdict};
use std::net::Ipv4Addr;

const VM_A: PortId = PortId(10);
const VM_B: PortId = PortId(11);
const A_MAC: spillway_wire::MacAddr = spillway_wire::MacAddr([2, 0, 0, 1, 0, 0x0a]);
const B_MAC: spillway_wire::MacAddr = spillway_wire::MacAddr([2, 0, 0, 1, 0, 0x0b]);
const A_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 10);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 11);
const OTHER_HOST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 99);

/// One tenant with two VMs; `udp_in` is the action of B's ingress rule for UDP from the tenant
/// (`"allow"` or `"deny"`). SNAT hands out port 4789 only, so an internet reply to the SNAT
/// address arrives on the uplink addressed to UDP port 4789.
fn policy(udp_in: &str) -> Policy {
    let text = format!(
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
snat = {{ public_ip = "203.0.113.10", port_min = 4789, port_max = 4789 }}
[[tenant.route]]
prefix = "10.2.0.0/16"
target = {{ tunnel = "192.0.2.2" }}
[[tenant.route]]
prefix = "0.0.0.0/0"
target = "internet"

[[port]]
id = 10
tenant = 1
mac = "02:00:00:01:00:0a"
ips = ["10.1.0.10"]
security_groups = [1]

[[port]]
id = 11
tenant = 1
mac = "02:00:00:01:00:0b"
ips = ["10.1.0.11"]
security_groups = [1]

[[security_group]]
id = 1
tenant = 1
[[security_group.rule]]
direction = "ingress"
priority = 100
action = "{udp_in}"
protocol = "udp"
remote = "10.0.0.0/8"
"#
    );
    Policy::from_toml_str(&text, "vxlan_ingress.toml").expect("the test policy compiles")
}

fn pipelines(udp_in: &str) -> [Pipeline; 2] {
    [true, false].map(|fast_path| {
        Pipeline::new(
            policy(udp_in),
            PipelineConfig {
                fast_path,
                ..PipelineConfig::default()
            },
        )
        .expect("valid pipeline config")
    })
}

/// A UDP payload that is a well-formed VXLAN header (I flag, VNI 1001) and inner frame.
fn vxlan_looking_payload() -> Vec<u8> {
    let inner = udp(A_MAC, B_MAC, (A_IP, 1), (B_IP, 2), b"inner");
    let mut p = vec![0x08, 0, 0, 0, 0, 0x03, 0xe9, 0];
    p.extend_from_slice(&inner);
    p
}

/// A UDP payload that is not VXLAN (the I flag is clear): what a VXLAN parse calls malformed.
fn not_vxlan_payload() -> Vec<u8> {
    b"\x00\x00\x00\x00 just some tenant bytes".to_vec()
}

fn count(p: &Pipeline, name: &str) -> u64 {
    p.counters()
        .iter()
        .chain(p.drops().iter())
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

#[test]
fn vm_to_vm_udp_to_4789_is_forwarded_whatever_its_payload() {
    for payload in [vxlan_looking_payload(), not_vxlan_payload()] {
        for mut p in pipelines("allow") {
            let there = udp(A_MAC, ACME_ROUTER, (A_IP, 40000), (B_IP, 4789), &payload);
            let (v, out, _) = run(&mut p, secs(1), VM_A, &there);
            assert_eq!(v, Verdict::Forward(VM_B));
            assert_eq!(
                &out[12..],
                &routed(&there)[12..],
                "only the MACs and TTL change"
            );
            // The answer from 4789 rides the connection (the fast path when it is on).
            let back = udp(B_MAC, ACME_ROUTER, (B_IP, 4789), (A_IP, 40000), &payload);
            let (v, out, _) = run(&mut p, secs(1), VM_B, &back);
            assert_eq!(v, Verdict::Forward(VM_A));
            assert_eq!(&out[12..], &routed(&back)[12..]);
            assert_eq!(count(&p, "vswitch.drop.malformed"), 0);
            assert_eq!(count(&p, "vswitch.tx.forwarded"), 2);
        }
    }
}

#[test]
fn vm_to_vm_udp_to_4789_is_denied_by_security_groups_like_any_udp() {
    for payload in [vxlan_looking_payload(), not_vxlan_payload()] {
        for mut p in pipelines("deny") {
            let there = udp(A_MAC, ACME_ROUTER, (A_IP, 40000), (B_IP, 4789), &payload);
            let (v, _, _) = run(&mut p, secs(1), VM_A, &there);
            assert!(
                matches!(v, Verdict::Drop(DropReason::SecurityGroupDeny { .. })),
                "{v:?}"
            );
            assert_eq!(count(&p, "vswitch.drop.sg_deny"), 1);
            assert_eq!(count(&p, "vswitch.drop.malformed"), 0);
        }
    }
}

#[test]
fn vm_to_internet_udp_to_4789_is_snated_on_its_headers_only() {
    for mut p in pipelines("allow") {
        let payload = vxlan_looking_payload();
        let out_frame = udp(
            A_MAC,
            ACME_ROUTER,
            (A_IP, 40000),
            (INTERNET_HOST, 4789),
            &payload,
        );
        let (v, out, _) = run(&mut p, secs(1), VM_A, &out_frame);
        assert_eq!(v, Verdict::Forward(UPLINK));
        let h = spillway_wire::parse_frame_decap(&out, spillway_wire::Decap::Off)
            .expect("parses")
            .outer;
        let key = h.key.expect("IP");
        assert_eq!(key.src_ip, Ipv4Addr::new(203, 0, 113, 10).into());
        assert_eq!(key.src_port, 4789, "the only port of the SNAT pool");
        let at = h.payload_offset as usize;
        assert_eq!(
            &out[at..],
            &payload[..],
            "the payload is not an inner frame"
        );

        // The internet's answer arrives on the uplink for the SNAT address, UDP port 4789: it is
        // return traffic of the connection, not VXLAN (it is not addressed to our VTEP).
        for reply_payload in [vxlan_looking_payload(), not_vxlan_payload()] {
            let reply = udp(
                GATEWAY_MAC,
                UPLINK_MAC,
                (INTERNET_HOST, 4789),
                (Ipv4Addr::new(203, 0, 113, 10), 4789),
                &reply_payload,
            );
            let (v, out, _) = run(&mut p, secs(2), UPLINK, &reply);
            assert_eq!(v, Verdict::Forward(VM_A));
            let h = spillway_wire::parse_frame_decap(&out, spillway_wire::Decap::Off)
                .expect("parses")
                .outer;
            let key = h.key.expect("IP");
            assert_eq!((key.dst_ip, key.dst_port), (A_IP.into(), 40000));
            assert_eq!(&out[h.payload_offset as usize..], &reply_payload[..]);
        }
        assert_eq!(count(&p, "vswitch.drop.not_for_us"), 0);
        assert_eq!(count(&p, "vswitch.drop.malformed"), 0);
    }
}

#[test]
fn uplink_vxlan_to_our_vtep_is_still_decapsulated() {
    for mut p in pipelines("allow") {
        let inner = udp(
            A_MAC,
            ACME_ROUTER,
            (Ipv4Addr::new(10, 2, 0, 5), 5353),
            (B_IP, 53),
            b"q",
        );
        let frame = vxlan(&inner, REMOTE_VTEP, VTEP, ACME_VNI);
        let (v, out, _) = run(&mut p, secs(1), UPLINK, &frame);
        assert_eq!(v, Verdict::Forward(VM_B));
        assert_eq!(&out[14..], &inner[14..], "decapsulated, inner L3 untouched");
        assert_eq!(count(&p, "vswitch.slow_path.new_conn"), 1);
    }
}

#[test]
fn uplink_vxlan_to_another_address_is_not_for_us_whatever_its_header() {
    // Before decapsulation was tied to the VTEP address, a well-formed header was dropped as
    // `not_for_us` and a bad one as `malformed`; now both are plain UDP to an address that is
    // neither our VTEP nor a SNAT address.
    for mut p in pipelines("allow") {
        let inner = udp(
            A_MAC,
            ACME_ROUTER,
            (Ipv4Addr::new(10, 2, 0, 5), 5353),
            (B_IP, 53),
            b"q",
        );
        let good = vxlan(&inner, REMOTE_VTEP, OTHER_HOST, ACME_VNI);
        let mut bad = good.clone();
        bad[14 + 20 + 8] = 0; // clear the I flag
        for frame in [good, bad] {
            let (v, _, fast) = run(&mut p, secs(1), UPLINK, &frame);
            assert_eq!((v, fast), (Verdict::Drop(DropReason::NotForUs), false));
        }
        assert_eq!(p.drops().get(DropKind::NotForUs), 2);
        assert_eq!(count(&p, "vswitch.drop.malformed"), 0);
    }
}
