//! Scenario tests of the vSwitch pipeline over the shipped example policy
//! (`examples/policy-basic.toml`): each test drives real frames through `Pipeline::process` and
//! asserts the verdict, the rewritten bytes (re-parsed with `spillway_wire`, checksums verified),
//! which path handled the frame, and the counters by name. `common::run` checks the pipeline's
//! invariants (conservation, table bounds) after every frame.

mod common;

use common::*;
use spillway_vswitch::conntrack::ConntrackConfig;
use spillway_vswitch::flow_table::{FlowTableConfig, FullPolicy};
use spillway_vswitch::pipeline::PipelineConfig;
use spillway_vswitch::{DropKind, DropReason, SecurityGroupId, TenantId, Verdict};
use spillway_wire::{IpAddr16, ParseOptions, checksum, ip_proto, parse_frame};

fn parse(frame: &[u8]) -> spillway_wire::ParsedFrame {
    parse_frame(frame, &ParseOptions::default()).expect("output frames parse")
}

/// IPv4 header and TCP/UDP checksums of the innermost packet are valid.
fn assert_checksums(frame: &[u8]) {
    let p = parse(frame);
    let h = p.innermost();
    let l3 = h.l3_offset as usize;
    assert!(
        checksum::ipv4_header_valid(&frame[l3..l3 + 20]),
        "IPv4 header checksum"
    );
    let key = h.key.expect("IP");
    let (src, dst) = (
        key.src_ip.v4_octets().unwrap(),
        key.dst_ip.v4_octets().unwrap(),
    );
    let seg = &frame[h.l4_offset as usize..l3 + h.l3_len as usize];
    if key.proto == ip_proto::TCP || key.proto == ip_proto::UDP {
        assert!(
            checksum::verify_l4_v4(src, dst, key.proto, seg),
            "L4 checksum"
        );
    }
    if let Some(outer) = p.vxlan.map(|_| p.outer) {
        let l3 = outer.l3_offset as usize;
        assert!(
            checksum::ipv4_header_valid(&frame[l3..l3 + 20]),
            "outer IPv4 checksum"
        );
    }
}

#[test]
fn local_connection_takes_the_slow_path_once_then_both_directions_hit() {
    let mut p = pipeline(PipelineConfig::default());
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (DB_IP, 5432), SYN);
    let (v, out, fast) = run(&mut p, secs(1), WEB, &syn);
    assert_eq!(v, Verdict::Forward(DB));
    assert!(!fast);
    let h = parse(&out).outer;
    assert_eq!((h.src_mac, h.dst_mac), (ACME_ROUTER, DB_MAC));
    assert_eq!(
        &out[12..],
        &routed(&syn)[12..],
        "only the MACs and the TTL change on a local route"
    );

    let syn_ack = to_acme(DB_MAC, (DB_IP, 5432), (WEB_IP, 40000), SYN | ACK);
    let (v, out, fast) = run(&mut p, secs(1), DB, &syn_ack);
    assert_eq!(v, Verdict::Forward(WEB));
    assert!(fast, "the reverse entry was installed with the forward one");
    assert_eq!(parse(&out).outer.dst_mac, WEB_MAC);

    let ack = tcp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 40000),
        (DB_IP, 5432),
        ACK,
        b"hello",
    );
    let (v, _, fast) = run(&mut p, secs(1), WEB, &ack);
    assert_eq!((v, fast), (Verdict::Forward(DB), true));
    let c = p.counters();
    assert_eq!(
        (c.slow_path_packets, c.fast_path_hits, c.new_connections),
        (1, 2, 1)
    );
    assert_eq!(c.flows_installed, 2);
}

#[test]
fn inbound_connection_without_a_matching_rule_is_denied_by_default() {
    let mut p = pipeline(PipelineConfig::default());
    // web2's groups allow 80/443 and SSH from 10.2.0.0/16 only.
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (WEB2_IP, 22), SYN);
    let (v, _, _) = run(&mut p, secs(1), WEB, &syn);
    assert_eq!(v, Verdict::Drop(DropReason::SecurityGroupDefaultDeny));
    assert_eq!(p.drops().get(DropKind::SecurityGroupDefaultDeny), 1);
    assert_eq!(p.flows().len(), 0, "a denied connection installs nothing");
}

#[test]
fn egress_deny_rule_names_its_group_and_rule() {
    let mut p = pipeline(PipelineConfig::default());
    // The db may not reach the internet: group 2, rule 2 (deny any to 0.0.0.0/0).
    let syn = to_acme(DB_MAC, (DB_IP, 40000), (INTERNET_HOST, 80), SYN);
    let (v, _, _) = run(&mut p, secs(1), DB, &syn);
    assert_eq!(
        v,
        Verdict::Drop(DropReason::SecurityGroupDeny {
            group: SecurityGroupId(2),
            rule: 2
        })
    );
}

#[test]
fn spoofed_source_mac_or_ip_is_dropped_on_both_paths() {
    let mut p = pipeline(PipelineConfig::default());
    let bad_ip = to_acme(WEB_MAC, (WEB2_IP, 40000), (DB_IP, 5432), SYN);
    assert_eq!(
        run(&mut p, secs(1), WEB, &bad_ip).0,
        Verdict::Drop(DropReason::SpoofedIp)
    );
    let bad_mac = to_acme(WEB2_MAC, (WEB_IP, 40000), (DB_IP, 5432), SYN);
    assert_eq!(
        run(&mut p, secs(1), WEB, &bad_mac).0,
        Verdict::Drop(DropReason::SpoofedMac)
    );
    // Establish a connection, then spoof the MAC on a packet that would hit its entry.
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (DB_IP, 5432), SYN);
    assert_eq!(run(&mut p, secs(1), WEB, &syn).0, Verdict::Forward(DB));
    let spoofed = to_acme(WEB2_MAC, (WEB_IP, 40000), (DB_IP, 5432), SYN);
    let (v, _, fast) = run(&mut p, secs(1), WEB, &spoofed);
    assert_eq!((v, fast), (Verdict::Drop(DropReason::SpoofedMac), false));
}

#[test]
fn internet_traffic_is_snatted_and_the_return_is_translated_back() {
    let mut p = pipeline(PipelineConfig::default());
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (INTERNET_HOST, 80), SYN);
    let (v, out, _) = run(&mut p, secs(1), WEB, &syn);
    assert_eq!(v, Verdict::Forward(UPLINK));
    let h = parse(&out).outer;
    let key = h.key.unwrap();
    assert_eq!((h.src_mac, h.dst_mac), (UPLINK_MAC, GATEWAY_MAC));
    assert_eq!(key.src_ip, IpAddr16::from(ACME_PUBLIC));
    assert_eq!(
        key.src_port, 1024,
        "the pool allocates from port_min upward"
    );
    assert_checksums(&out);
    assert_eq!(p.snat_in_use(TenantId(1), ip_proto::TCP), 1);

    let back = tcp(
        GATEWAY_MAC,
        UPLINK_MAC,
        (INTERNET_HOST, 80),
        (ACME_PUBLIC, 1024),
        SYN | ACK,
        b"",
    );
    let (v, out, fast) = run(&mut p, secs(1), UPLINK, &back);
    assert_eq!((v, fast), (Verdict::Forward(WEB), true));
    let h = parse(&out).outer;
    let key = h.key.unwrap();
    assert_eq!((key.dst_ip, key.dst_port), (IpAddr16::from(WEB_IP), 40000));
    assert_eq!((h.src_mac, h.dst_mac), (ACME_ROUTER, WEB_MAC));
    assert_checksums(&out);

    // Unsolicited traffic to the public address has no connection.
    let stray = tcp(
        GATEWAY_MAC,
        UPLINK_MAC,
        (INTERNET_HOST, 80),
        (ACME_PUBLIC, 1025),
        ACK,
        b"",
    );
    assert_eq!(
        run(&mut p, secs(1), UPLINK, &stray).0,
        Verdict::Drop(DropReason::NoConnection)
    );
}

#[test]
fn snat_udp_and_icmp_echo_translate_ports_and_identifiers() {
    let mut p = pipeline(PipelineConfig::default());
    let q = udp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 5353),
        (INTERNET_HOST, 53),
        b"query",
    );
    let (v, out, _) = run(&mut p, secs(1), WEB, &q);
    assert_eq!(v, Verdict::Forward(UPLINK));
    assert_checksums(&out);
    let echo = ping(WEB_MAC, ACME_ROUTER, WEB_IP, INTERNET_HOST, 77, false);
    let (v, out, _) = run(&mut p, secs(1), WEB, &echo);
    assert_eq!(v, Verdict::Forward(UPLINK));
    let key = parse(&out).outer.key.unwrap();
    assert_eq!(
        (key.src_port, key.dst_port),
        (1024, 0x0800),
        "echo id translated, type 8 code 0 kept"
    );
    assert!(
        checksum::checksum(&out[34..]) == 0,
        "ICMP checksum stays valid"
    );
    let reply = ping(
        GATEWAY_MAC,
        UPLINK_MAC,
        INTERNET_HOST,
        ACME_PUBLIC,
        1024,
        true,
    );
    let (v, out, fast) = run(&mut p, secs(1), UPLINK, &reply);
    assert_eq!((v, fast), (Verdict::Forward(WEB), true));
    let key = parse(&out).outer.key.unwrap();
    assert_eq!(
        (key.dst_ip, key.src_port, key.dst_port),
        (IpAddr16::from(WEB_IP), 77, 0x0000),
        "echo reply (type 0) with the VM's identifier"
    );
    assert!(checksum::checksum(&out[34..]) == 0);
}

#[test]
fn remote_subnet_is_encapsulated_and_the_reply_decapsulated() {
    let mut p = pipeline(PipelineConfig::default());
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (REMOTE_VM, 8080), SYN);
    let (v, out, _) = run(&mut p, secs(1), WEB, &syn);
    assert_eq!(v, Verdict::Forward(UPLINK));
    let parsed = parse(&out);
    let vx = parsed.vxlan.expect("VXLAN encapsulated");
    assert_eq!(vx.vni.get(), ACME_VNI);
    let outer = parsed.outer.key.unwrap();
    assert_eq!(
        (outer.src_ip, outer.dst_ip),
        (IpAddr16::from(VTEP), IpAddr16::from(REMOTE_VTEP))
    );
    assert_eq!(outer.dst_port, 4789);
    assert!(
        outer.src_port >= 49152,
        "entropy source port in the dynamic range"
    );
    assert_eq!(
        &out[vx.inner_offset as usize + 12..],
        &routed(&syn)[12..],
        "inner packet unchanged but for the TTL"
    );
    assert_checksums(&out);

    let reply_inner = to_acme(ACME_ROUTER, (REMOTE_VM, 8080), (WEB_IP, 40000), SYN | ACK);
    let reply = vxlan(&reply_inner, REMOTE_VTEP, VTEP, ACME_VNI);
    let (v, out, fast) = run(&mut p, secs(1), UPLINK, &reply);
    assert_eq!((v, fast), (Verdict::Forward(WEB), true));
    assert_eq!(out.len(), reply_inner.len(), "decapsulated");
    assert_eq!(parse(&out).outer.dst_mac, WEB_MAC);
}

#[test]
fn overlay_connection_into_a_vm_is_checked_by_its_ingress_group() {
    let mut p = pipeline(PipelineConfig::default());
    // SSH from 10.2.0.0/16 is allowed by group 3.
    let inner = to_acme(ACME_ROUTER, (REMOTE_VM, 50000), (WEB_IP, 22), SYN);
    let (v, _, _) = run(
        &mut p,
        secs(1),
        UPLINK,
        &vxlan(&inner, REMOTE_VTEP, VTEP, ACME_VNI),
    );
    assert_eq!(v, Verdict::Forward(WEB));
    // The VM's reply goes back to the VTEP the connection came from.
    let reply = to_acme(WEB_MAC, (WEB_IP, 22), (REMOTE_VM, 50000), SYN | ACK);
    let (v, out, fast) = run(&mut p, secs(1), WEB, &reply);
    assert_eq!((v, fast), (Verdict::Forward(UPLINK), true));
    assert_eq!(
        parse(&out).outer.key.unwrap().dst_ip,
        IpAddr16::from(REMOTE_VTEP)
    );
    // Port 23 is not allowed.
    let inner = to_acme(ACME_ROUTER, (REMOTE_VM, 50001), (WEB_IP, 23), SYN);
    let (v, _, _) = run(
        &mut p,
        secs(1),
        UPLINK,
        &vxlan(&inner, REMOTE_VTEP, VTEP, ACME_VNI),
    );
    assert_eq!(v, Verdict::Drop(DropReason::SecurityGroupDefaultDeny));
}

#[test]
fn overlay_frames_for_other_vteps_or_vnis_are_dropped_with_reasons() {
    let mut p = pipeline(PipelineConfig::default());
    let inner = to_acme(ACME_ROUTER, (REMOTE_VM, 50000), (WEB_IP, 22), SYN);
    let other_vtep = std::net::Ipv4Addr::new(192, 0, 2, 99);
    let (v, _, _) = run(
        &mut p,
        secs(1),
        UPLINK,
        &vxlan(&inner, REMOTE_VTEP, other_vtep, ACME_VNI),
    );
    assert_eq!(v, Verdict::Drop(DropReason::NotForUs));
    let (v, _, _) = run(
        &mut p,
        secs(1),
        UPLINK,
        &vxlan(&inner, REMOTE_VTEP, VTEP, 4242),
    );
    assert_eq!(v, Verdict::Drop(DropReason::UnknownVni(4242)));
    // Once a connection exists, a copy sent to another VTEP must still not hit its entry.
    assert_eq!(
        run(
            &mut p,
            secs(1),
            UPLINK,
            &vxlan(&inner, REMOTE_VTEP, VTEP, ACME_VNI)
        )
        .0,
        Verdict::Forward(WEB)
    );
    let (v, _, fast) = run(
        &mut p,
        secs(1),
        UPLINK,
        &vxlan(&inner, REMOTE_VTEP, other_vtep, ACME_VNI),
    );
    assert_eq!((v, fast), (Verdict::Drop(DropReason::NotForUs), false));
}

#[test]
fn tenants_with_overlapping_addresses_never_meet() {
    let mut p = pipeline(PipelineConfig::default());
    // globex's VM has acme's web address; acme's 10.1.0.11 does not exist in globex.
    let syn = tcp(
        GLOBEX_MAC,
        GLOBEX_ROUTER,
        (WEB_IP, 40000),
        (WEB2_IP, 80),
        SYN,
        b"",
    );
    // Its router answers host unreachable (ICMP 3/1) from globex's router address.
    let (v, out, _) = run(&mut p, secs(1), GLOBEX, &syn);
    assert_eq!(v, Verdict::Forward(GLOBEX));
    assert_eq!(
        (out[23], out[34], out[35]),
        (1, 3, 1),
        "ICMP host unreachable"
    );
    assert_eq!(&out[26..30], &[10, 1, 0, 1], "from globex's router");
    assert_eq!(p.icmp_error_counters().unreachable, 1);
    // The same 5-tuple in acme is a different connection in a different zone.
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (WEB2_IP, 80), SYN);
    assert_eq!(run(&mut p, secs(1), WEB, &syn).0, Verdict::Forward(WEB2));
    // acme's VNI carries nothing into globex.
    let inner = to_acme(ACME_ROUTER, (REMOTE_VM, 1), (WEB_IP, 8000), SYN);
    let (v, _, _) = run(
        &mut p,
        secs(1),
        UPLINK,
        &vxlan(&inner, REMOTE_VTEP, VTEP, ACME_VNI),
    );
    assert_eq!(
        v,
        Verdict::Drop(DropReason::SecurityGroupDefaultDeny),
        "acme web, not globex"
    );
}

#[test]
fn blackhole_malformed_and_mid_stream_packets_are_counted_and_arp_answered() {
    let mut p = pipeline(PipelineConfig::default());
    let bh = tcp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 1),
        (std::net::Ipv4Addr::new(10, 1, 255, 1), 80),
        SYN,
        b"",
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &bh).0,
        Verdict::Drop(DropReason::Blackhole)
    );
    let arp = spillway_wire::build::FrameBuilder::new()
        .eth(WEB_MAC, spillway_wire::MacAddr::BROADCAST)
        .arp(
            1,
            WEB_IP.octets(),
            spillway_wire::MacAddr::ZERO,
            DB_IP.octets(),
        )
        .build();
    // ARP from a VM is answered by the neighbour responder (tests/neigh.rs), not dropped.
    assert_eq!(run(&mut p, secs(1), WEB, &arp).0, Verdict::Forward(WEB));
    let mut bad = to_acme(WEB_MAC, (WEB_IP, 1), (DB_IP, 5432), SYN);
    bad[14] = 0x44; // IHL 4
    assert!(matches!(
        run(&mut p, secs(1), WEB, &bad).0,
        Verdict::Drop(DropReason::Malformed(_))
    ));
    let ack = to_acme(WEB_MAC, (WEB_IP, 2), (DB_IP, 5432), ACK);
    assert_eq!(
        run(&mut p, secs(1), WEB, &ack).0,
        Verdict::Drop(DropReason::NoConnection)
    );
    let d = p.drops();
    for k in [
        DropKind::Blackhole,
        DropKind::Malformed,
        DropKind::NoConnection,
    ] {
        assert_eq!(d.get(k), 1, "{}", k.metric());
    }
    assert_eq!(p.counters().dropped, 3);
}

#[test]
fn policy_change_bumps_the_epoch_and_stale_entries_are_recomputed_lazily() {
    let mut p = pipeline(PipelineConfig::default());
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (DB_IP, 5432), SYN);
    run(&mut p, secs(1), WEB, &syn);
    let syn_ack = to_acme(DB_MAC, (DB_IP, 5432), (WEB_IP, 40000), SYN | ACK);
    run(&mut p, secs(1), DB, &syn_ack);
    let before = p.epoch();
    p.set_policy(example_policy());
    assert_eq!(p.epoch(), before.next());
    assert_eq!(p.flows().len(), 2, "no global flush");
    let ack = tcp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 40000),
        (DB_IP, 5432),
        ACK,
        b"x",
    );
    let (v, _, fast) = run(&mut p, secs(2), WEB, &ack);
    assert_eq!((v, fast), (Verdict::Forward(DB), false));
    assert_eq!(p.counters().stale_epoch, 1);
    assert_eq!(
        p.counters().new_connections,
        1,
        "the connection survived the policy change"
    );
    let (_, _, fast) = run(&mut p, secs(2), WEB, &ack);
    assert!(fast, "recomputed entry is current");
}

#[test]
fn full_conntrack_drops_new_connections_and_keeps_established_ones() {
    let cfg = PipelineConfig {
        conntrack: ConntrackConfig {
            capacity: 1,
            ..ConntrackConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = pipeline(cfg);
    let syn = to_acme(WEB_MAC, (WEB_IP, 40000), (DB_IP, 5432), SYN);
    assert_eq!(run(&mut p, secs(1), WEB, &syn).0, Verdict::Forward(DB));
    let syn2 = to_acme(WEB_MAC, (WEB_IP, 40001), (DB_IP, 5432), SYN);
    assert_eq!(
        run(&mut p, secs(1), WEB, &syn2).0,
        Verdict::Drop(DropReason::ConntrackFull)
    );
    let syn_ack = to_acme(DB_MAC, (DB_IP, 5432), (WEB_IP, 40000), SYN | ACK);
    assert_eq!(run(&mut p, secs(1), DB, &syn_ack).0, Verdict::Forward(WEB));
}

#[test]
fn full_flow_table_in_reject_mode_still_forwards_through_the_slow_path() {
    let cfg = PipelineConfig {
        flow_table: FlowTableConfig {
            capacity: 2,
            full: FullPolicy::Reject,
            ..FlowTableConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = pipeline(cfg);
    run(
        &mut p,
        secs(1),
        WEB,
        &to_acme(WEB_MAC, (WEB_IP, 1), (DB_IP, 5432), SYN),
    );
    let second = to_acme(WEB_MAC, (WEB_IP, 2), (DB_IP, 5432), SYN);
    let (v, _, _) = run(&mut p, secs(1), WEB, &second);
    assert_eq!(v, Verdict::Forward(DB));
    assert_eq!(p.counters().flows_rejected, 2);
    let (v, _, fast) = run(&mut p, secs(1), WEB, &second);
    assert_eq!((v, fast), (Verdict::Forward(DB), false));
    assert_eq!(p.flows().len(), 2);
}

#[test]
fn expired_snat_connections_return_their_ports() {
    let mut p = pipeline(PipelineConfig::default());
    let q = udp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 5353),
        (INTERNET_HOST, 53),
        b"q",
    );
    run(&mut p, secs(1), WEB, &q);
    assert_eq!(p.snat_in_use(TenantId(1), ip_proto::UDP), 1);
    // Unreplied UDP expires after its timeout; sweep the whole (small) table.
    let later = secs(1)
        + ConntrackConfig::default().timeouts.udp_unreplied
        + core::time::Duration::from_secs(1);
    let mut n = 0;
    for _ in 0..64 {
        n += p.expire(later, 1 << 16);
    }
    assert!(n >= 1);
    assert_eq!(p.snat_in_use(TenantId(1), ip_proto::UDP), 0);
    assert_eq!(p.conntrack().len(), 0);
}

#[test]
fn tcp_close_sequence_runs_on_the_fast_path_and_rst_is_tracked() {
    let mut p = pipeline(PipelineConfig::default());
    let a = (WEB_IP, 40000);
    let b = (DB_IP, 5432);
    let steps = [
        (WEB, WEB_MAC, a, b, SYN),
        (DB, DB_MAC, b, a, SYN | ACK),
        (WEB, WEB_MAC, a, b, ACK),
        (WEB, WEB_MAC, a, b, FIN | ACK),
        (DB, DB_MAC, b, a, FIN | ACK),
        (WEB, WEB_MAC, a, b, ACK),
    ];
    for (i, (port, mac, s, d, f)) in steps.into_iter().enumerate() {
        let (v, _, fast) = run(&mut p, secs(1), port, &tcp(mac, ACME_ROUTER, s, d, f, b""));
        assert!(matches!(v, Verdict::Forward(_)), "step {i}: {v:?}");
        assert_eq!(fast, i > 0, "step {i}");
    }
    assert_eq!(p.counters().new_connections, 1);
}

#[test]
fn ipv6_connections_route_locally_and_over_the_overlay() {
    use spillway_wire::build::FrameBuilder;
    use std::net::Ipv6Addr;
    let web6: Ipv6Addr = "fd00:1::10".parse().unwrap();
    let web2_6: Ipv6Addr = "fd00:1::11".parse().unwrap();
    let remote6: Ipv6Addr = "fd00:2::5".parse().unwrap();
    let mut p = pipeline(PipelineConfig::default());
    let syn = |src_mac, src, dst, dport| {
        FrameBuilder::new()
            .eth(src_mac, ACME_ROUTER)
            .ipv6(src, dst)
            .tcp(40000, dport)
            .tcp_flags(SYN)
            .build()
    };
    // Group 1 admits TCP 443 from ::/0 on web2.
    let (v, out, _) = run(&mut p, secs(1), WEB, &syn(WEB_MAC, web6, web2_6, 443));
    assert_eq!(v, Verdict::Forward(WEB2));
    assert_eq!(parse(&out).outer.dst_mac, WEB2_MAC);
    // Port 80 is admitted only from 0.0.0.0/0, which never matches IPv6.
    let (v, _, _) = run(&mut p, secs(1), WEB, &syn(WEB_MAC, web6, web2_6, 80));
    assert_eq!(v, Verdict::Drop(DropReason::SecurityGroupDefaultDeny));
    // fd00:2::/64 is tunnelled to 192.0.2.2: an IPv6 inner packet over the IPv4 underlay.
    let (v, out, _) = run(&mut p, secs(1), WEB, &syn(WEB_MAC, web6, remote6, 22));
    assert_eq!(v, Verdict::Forward(UPLINK));
    let parsed = parse(&out);
    assert_eq!(
        parsed.outer.key.unwrap().dst_ip,
        IpAddr16::from(REMOTE_VTEP)
    );
    assert_eq!(
        parsed.inner.unwrap().key.unwrap().dst_ip,
        IpAddr16::from(remote6)
    );
    // An IPv6 source the port does not own is spoofed.
    let (v, _, _) = run(&mut p, secs(1), WEB, &syn(WEB_MAC, web2_6, remote6, 22));
    assert_eq!(v, Verdict::Drop(DropReason::SpoofedIp));
}

#[test]
fn a_connection_reclaimed_to_make_room_returns_its_snat_port() {
    let cfg = PipelineConfig {
        conntrack: ConntrackConfig {
            capacity: 1,
            ..ConntrackConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = pipeline(cfg);
    let q = udp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 5353),
        (INTERNET_HOST, 53),
        b"q",
    );
    assert_eq!(run(&mut p, secs(1), WEB, &q).0, Verdict::Forward(UPLINK));
    // Long after the first binding expired, with no sweep in between, a second connection needs
    // the only conntrack slot: creating it reclaims the expired one, which must free its port.
    let later = secs(1000);
    let q2 = udp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 5354),
        (INTERNET_HOST, 53),
        b"q",
    );
    let (v, out, _) = run(&mut p, later, WEB, &q2);
    assert_eq!(v, Verdict::Forward(UPLINK));
    assert_eq!(
        p.snat_in_use(TenantId(1), ip_proto::UDP),
        1,
        "the reclaimed binding was released"
    );
    assert_eq!(
        parse(&out).outer.key.unwrap().src_port,
        1025,
        "the cursor moved on"
    );
}

#[test]
fn icmp_error_about_a_snatted_packet_is_translated_back_to_the_vm() {
    let mut p = pipeline(PipelineConfig::default());
    let q = udp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 5353),
        (INTERNET_HOST, 53),
        b"query",
    );
    let (v, out, _) = run(&mut p, secs(1), WEB, &q);
    assert_eq!(v, Verdict::Forward(UPLINK));
    // A router on the way answers the translated datagram with "fragmentation needed".
    let router = std::net::Ipv4Addr::new(192, 0, 2, 77);
    let frag_needed = spillway_wire::build::FrameBuilder::new()
        .eth(GATEWAY_MAC, UPLINK_MAC)
        .ipv4(router, ACME_PUBLIC)
        .icmp(3, 4)
        .payload(&out[14..])
        .build();
    let (v, back, fast) = run(&mut p, secs(2), UPLINK, &frag_needed);
    assert_eq!((v, fast), (Verdict::Forward(WEB), false));
    assert_eq!(p.counters().icmp_related, 1);
    let h = parse(&back).outer;
    let key = h.key.unwrap();
    assert_eq!(
        (key.src_ip, key.dst_ip, key.dst_port),
        (IpAddr16::from(router), IpAddr16::from(WEB_IP), 0x0304)
    );
    assert_eq!((h.src_mac, h.dst_mac), (ACME_ROUTER, WEB_MAC));
    assert!(
        checksum::ipv4_header_valid(&back[14..34]),
        "outer IPv4 checksum"
    );
    assert_eq!(checksum::checksum(&back[34..]), 0, "ICMP checksum");
    // The embedded packet is again exactly what the VM sent: address, port and both checksums
    // (and the TTL our router left it with, which is what the far router saw).
    assert_eq!(&back[42..], &routed(&q)[14..]);
    // An error about a port no connection holds is not related.
    let mut stray = out.clone();
    stray[34..36].copy_from_slice(&4242u16.to_be_bytes());
    let stray_err = spillway_wire::build::FrameBuilder::new()
        .eth(GATEWAY_MAC, UPLINK_MAC)
        .ipv4(router, ACME_PUBLIC)
        .icmp(3, 4)
        .payload(&stray[14..])
        .build();
    let (v, _, _) = run(&mut p, secs(2), UPLINK, &stray_err);
    assert_eq!(v, Verdict::Drop(DropReason::IcmpErrorUnrelated));
}

#[test]
fn unsolicited_echo_reply_from_the_internet_is_dropped_with_its_reason() {
    let mut p = pipeline(PipelineConfig::default());
    let reply = ping(
        GATEWAY_MAC,
        UPLINK_MAC,
        INTERNET_HOST,
        ACME_PUBLIC,
        1024,
        true,
    );
    let (v, _, _) = run(&mut p, secs(1), UPLINK, &reply);
    assert_eq!(v, Verdict::Drop(DropReason::IcmpUnsolicitedReply));
    assert!(p.conntrack().is_empty());
}
