//! The tenant router's forwarding rules through `Pipeline::process`, with the fast path on and
//! off: every routed packet leaves with its TTL / hop limit one less and a valid header; one
//! whose TTL is spent, or that is longer than the next link's MTU (the destination port's, the
//! overlay's, the underlay's), comes back to its sender as the ICMP / ICMPv6 error a router
//! sends, from the tenant's router address, quoting the packet as sent; packets with no route or
//! no VM get destination-unreachable. The errors are checked field by field and by checksum, and
//! parsed back with `spillway_wire` to prove the quoted header names the sender's own flow. The
//! cases where no error may be sent (about an error, a later fragment, a multicast destination,
//! an exhausted budget) are dropped with their reason and counted.

mod common;

use common::{ipv4_fragments, run, secs};
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::router::IcmpErrorLimit;
use spillway_vswitch::{DropReason, Instant, PortId, Verdict};
use spillway_wire::build::FrameBuilder;
use spillway_wire::{MacAddr, checksum, icmp, ip_proto, parse_frame};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const UPLINK: PortId = PortId(0);
const A: PortId = PortId(1);
const B: PortId = PortId(2);
const ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 1, 1]);
const GATEWAY: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xfe]);
const UPLINK_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const A_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0x0a]);
const B_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0x0b]);
const PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
const INTERNET: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

fn a_ip(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xa))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 10))
    }
}
fn b_ip(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 1, 0, 0, 0, 0xb))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 0, 1, 11))
    }
}
/// The router's address on A's subnet.
fn router_ip(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))
    }
}

/// A (MTU 1500) and B (MTU 1400) in two subnets of one tenant; a tunnel to 10.9.0.0/16 and
/// fd00:9::/64 over an underlay of MTU 1500; the internet through SNAT; everything allowed.
const POLICY: &str = r#"
[host]
uplink_port = 0
uplink_mac = "02:00:00:00:00:01"
vtep_ip = "192.0.2.1"
gateway_mac = "02:00:00:00:00:fe"
underlay_mtu = 1500
[[tenant]]
id = 1
vni = 7
router_mac = "02:00:00:00:01:01"
subnets = ["10.0.0.0/24", "10.0.1.0/24", "fd00::/64", "fd00:0:0:1::/64"]
router_ips = ["10.0.0.1", "10.0.1.1", "fd00::1", "fd00:0:0:1::1"]
snat = { public_ip = "203.0.113.10" }
[[tenant.route]]
prefix = "10.9.0.0/16"
target = { tunnel = "192.0.2.2" }
[[tenant.route]]
prefix = "fd00:9::/64"
target = { tunnel = "192.0.2.2" }
[[tenant.route]]
prefix = "0.0.0.0/0"
target = "internet"
[[port]]
id = 1
tenant = 1
mac = "02:00:00:00:00:0a"
ips = ["10.0.0.10", "fd00::a"]
security_groups = [1]
[[port]]
id = 2
tenant = 1
mac = "02:00:00:00:00:0b"
ips = ["10.0.1.11", "fd00:0:0:1::b"]
security_groups = [1]
mtu = 1400
[[security_group]]
id = 1
tenant = 1
[[security_group.rule]]
direction = "ingress"
priority = 1
action = "allow"
remote = "0.0.0.0/0"
[[security_group.rule]]
direction = "ingress"
priority = 1
action = "allow"
remote = "::/0"
"#;

fn pipeline(fast: bool, limit: IcmpErrorLimit) -> Pipeline {
    let policy = Policy::from_toml_str(POLICY, "router.toml").expect("test policy loads");
    Pipeline::new(
        policy,
        PipelineConfig {
            fast_path: fast,
            icmp_errors: limit,
            ..PipelineConfig::default()
        },
    )
    .expect("valid config")
}

/// A UDP datagram from A with `payload` bytes, TTL / hop limit `ttl`, DF set or not.
fn udp_from_a(dst: IpAddr, ttl: u8, payload: usize, df: bool) -> Vec<u8> {
    FrameBuilder::new()
        .eth(A_MAC, ROUTER)
        .ip(a_ip(dst.is_ipv6()), dst)
        .ttl(ttl)
        .dont_frag(df)
        .udp(40000, 5000)
        .payload(&vec![0x5a; payload])
        .build()
}

fn both(mut f: impl FnMut(bool, bool)) {
    for v6 in [false, true] {
        for fast in [false, true] {
            f(v6, fast);
        }
    }
}

/// Checks `out` is a valid ICMP / ICMPv6 error of `ty`/`code` with `rest` (the 32 bits after the
/// checksum) from `from` to the sender of `sent`, on Ethernet from `src_mac` to `dst_mac`, quoting
/// `sent`'s IP packet as sent (truncated to the RFC's limit).
#[allow(clippy::too_many_arguments)]
fn assert_error(
    out: &[u8],
    sent: &[u8],
    (src_mac, dst_mac): (MacAddr, MacAddr),
    from: IpAddr,
    ty: u8,
    code: u8,
    rest: u32,
) {
    assert_eq!(&out[0..6], &dst_mac.0, "Ethernet destination");
    assert_eq!(&out[6..12], &src_mac.0, "Ethernet source");
    let sent_ip = &sent[14..];
    let v6 = sent_ip[0] >> 4 == 6;
    let (ip_hdr, limit) = if v6 { (40, 1280) } else { (20, 576) };
    let msg = &out[14 + ip_hdr..];
    assert_eq!((msg[0], msg[1]), (ty, code), "type and code");
    assert_eq!(u32::from_be_bytes(msg[4..8].try_into().unwrap()), rest);
    let quoted = &msg[8..];
    assert_eq!(quoted.len(), sent_ip.len().min(limit - ip_hdr - 8));
    assert_eq!(
        quoted,
        &sent_ip[..quoted.len()],
        "quotes the packet as sent"
    );
    assert!(out.len() - 14 <= limit);
    if v6 {
        let ip = &out[14..54];
        assert_eq!(u16::from_be_bytes([out[12], out[13]]), 0x86dd);
        assert_eq!((ip[6], ip[7]), (ip_proto::ICMPV6, 64));
        let src: [u8; 16] = ip[8..24].try_into().unwrap();
        let dst: [u8; 16] = ip[24..40].try_into().unwrap();
        assert_eq!(IpAddr::from(src), from);
        assert_eq!(&dst, &sent_ip[8..24], "to the sender");
        assert_eq!(usize::from(u16::from_be_bytes([ip[4], ip[5]])), msg.len());
        assert!(checksum::verify_l4_v6(&src, &dst, ip_proto::ICMPV6, msg));
    } else {
        let ip = &out[14..34];
        assert_eq!(u16::from_be_bytes([out[12], out[13]]), 0x0800);
        assert!(checksum::ipv4_header_valid(ip), "IPv4 header checksum");
        assert_eq!((ip[8], ip[9]), (64, ip_proto::ICMP));
        assert_eq!(
            IpAddr::from(<[u8; 4]>::try_from(&ip[12..16]).unwrap()),
            from
        );
        assert_eq!(&ip[16..20], &sent_ip[12..16], "to the sender");
        assert_eq!(
            usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            20 + msg.len()
        );
        assert_eq!(checksum::checksum(msg), 0, "ICMP checksum");
    }
    // Our own parser reads it as an error whose quoted header is the sender's flow.
    let p = parse_frame(out, &Default::default()).expect("the error parses");
    let key = p.outer.key.expect("IP");
    assert_eq!(key.icmp_kind(), Some(icmp::IcmpKind::Error));
    let e = spillway_wire::icmp_error::embedded(v6, msg).expect("the quoted header is whole");
    let sent_key = parse_frame(sent, &Default::default())
        .unwrap()
        .outer
        .key
        .unwrap();
    assert_eq!(e.key, sent_key);
}

#[test]
fn routed_packets_leave_with_one_ttl_less_and_a_valid_header() {
    both(|v6, fast| {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        for t in 1..=3 {
            let f = udp_from_a(b_ip(v6), 9, 100, false);
            let (v, out, _) = run(&mut p, secs(t), A, &f);
            assert_eq!(v, Verdict::Forward(B), "v6 {v6} fast {fast}");
            let ip = &out[14..];
            if v6 {
                assert_eq!(ip[7], 8, "hop limit");
            } else {
                assert_eq!(ip[8], 8, "TTL");
                assert!(checksum::ipv4_header_valid(&ip[..20]));
            }
            // Nothing else changed but the MACs.
            let skip = if v6 { 7..8 } else { 8..12 };
            for (i, (x, y)) in ip.iter().zip(&f[14..]).enumerate() {
                assert!(skip.contains(&i) || x == y, "byte {i} of the IP packet");
            }
        }
        assert_eq!(p.counters().fast_path_hits, if fast { 2 } else { 0 });
    });
}

#[test]
fn a_spent_ttl_comes_back_as_time_exceeded_from_the_router() {
    both(|v6, fast| {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        // The first packet opens the connection and installs its entries; TTL 1 on the second
        // meets them on the fast path.
        let (v, _, _) = run(&mut p, secs(1), A, &udp_from_a(b_ip(v6), 64, 100, false));
        assert_eq!(v, Verdict::Forward(B));
        for ttl in [1, 0] {
            let sent = udp_from_a(b_ip(v6), ttl, 100, false);
            let (v, out, hit) = run(&mut p, secs(2), A, &sent);
            assert_eq!((v, hit), (Verdict::Forward(A), fast), "v6 {v6} fast {fast}");
            let ty = if v6 { 3 } else { 11 };
            assert_error(&out, &sent, (ROUTER, A_MAC), router_ip(v6), ty, 0, 0);
        }
        assert_eq!(p.icmp_error_counters().time_exceeded, 2);
        // A long packet is quoted up to the RFC's limit.
        let sent = udp_from_a(b_ip(v6), 1, 1300, false);
        let (v, out, _) = run(&mut p, secs(3), A, &sent);
        assert_eq!(v, Verdict::Forward(A));
        assert_eq!(out.len(), 14 + if v6 { 1280 } else { 576 });
        assert_error(
            &out,
            &sent,
            (ROUTER, A_MAC),
            router_ip(v6),
            out[if v6 { 54 } else { 34 }],
            0,
            0,
        );
    });
}

#[test]
fn too_big_for_the_destination_port_gets_fragmentation_needed_with_its_mtu() {
    both(|v6, fast| {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        let hdr = if v6 { 48 } else { 28 };
        // B's port carries 1400 bytes: exactly that passes, one more does not, DF or not.
        let fits = udp_from_a(b_ip(v6), 64, 1400 - hdr, true);
        assert_eq!(run(&mut p, secs(1), A, &fits).0, Verdict::Forward(B));
        for df in [true, false] {
            let sent = udp_from_a(b_ip(v6), 64, 1401 - hdr, df);
            let (v, out, _) = run(&mut p, secs(2), A, &sent);
            assert_eq!(v, Verdict::Forward(A), "v6 {v6} fast {fast} df {df}");
            let (ty, code) = if v6 { (2, 0) } else { (3, 4) };
            assert_error(&out, &sent, (ROUTER, A_MAC), router_ip(v6), ty, code, 1400);
        }
        assert_eq!(p.icmp_error_counters().too_big, 2);
        // The other way, toward A's 1500-byte port, 1401 bytes pass.
        let back = FrameBuilder::new()
            .eth(B_MAC, ROUTER)
            .ip(b_ip(v6), a_ip(v6))
            .udp(5000, 40000)
            .payload(&vec![1; 1401 - hdr])
            .build();
        assert_eq!(run(&mut p, secs(3), B, &back).0, Verdict::Forward(A));
    });
}

#[test]
fn the_overlay_carries_the_underlay_mtu_less_the_vxlan_overhead() {
    both(|v6, fast| {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        let remote: IpAddr = if v6 {
            "fd00:9::5".parse().unwrap()
        } else {
            "10.9.0.5".parse().unwrap()
        };
        let hdr = if v6 { 48 } else { 28 };
        let fits = udp_from_a(remote, 64, 1450 - hdr, true);
        let (v, out, _) = run(&mut p, secs(1), A, &fits);
        assert_eq!(v, Verdict::Forward(UPLINK));
        assert_eq!(out.len(), 1500 + 14, "a full underlay frame");
        let sent = udp_from_a(remote, 64, 1451 - hdr, true);
        let (v, out, _) = run(&mut p, secs(2), A, &sent);
        assert_eq!(v, Verdict::Forward(A), "v6 {v6} fast {fast}");
        let (ty, code) = if v6 { (2, 0) } else { (3, 4) };
        assert_error(&out, &sent, (ROUTER, A_MAC), router_ip(v6), ty, code, 1450);
    });
}

#[test]
fn the_internet_path_checks_the_underlay_mtu_before_snat() {
    for fast in [false, true] {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        let sent = udp_from_a(IpAddr::V4(INTERNET), 64, 1501 - 28, true);
        let (v, out, _) = run(&mut p, secs(1), A, &sent);
        assert_eq!(v, Verdict::Forward(A));
        // Quoted before translation: A recognises its own datagram.
        assert_error(&out, &sent, (ROUTER, A_MAC), router_ip(false), 3, 4, 1500);
    }
}

#[test]
fn an_internet_reply_with_a_spent_ttl_is_answered_from_the_snat_address() {
    for fast in [false, true] {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        let out_pkt = udp_from_a(IpAddr::V4(INTERNET), 64, 10, false);
        let (v, snat, _) = run(&mut p, secs(1), A, &out_pkt);
        assert_eq!(v, Verdict::Forward(UPLINK));
        let port = u16::from_be_bytes([snat[34], snat[35]]);
        let reply = |ttl| {
            FrameBuilder::new()
                .eth(GATEWAY, UPLINK_MAC)
                .ipv4(INTERNET, PUBLIC)
                .ttl(ttl)
                .udp(5000, port)
                .payload(b"hello")
                .build()
        };
        let (v, _, _) = run(&mut p, secs(2), UPLINK, &reply(64));
        assert_eq!(v, Verdict::Forward(A), "fast {fast}");
        let sent = reply(1);
        let (v, out, _) = run(&mut p, secs(3), UPLINK, &sent);
        assert_eq!(v, Verdict::Forward(UPLINK), "fast {fast}");
        assert_error(
            &out,
            &sent,
            (UPLINK_MAC, GATEWAY),
            IpAddr::V4(PUBLIC),
            11,
            0,
            0,
        );
    }
}

#[test]
fn no_route_and_no_vm_get_destination_unreachable() {
    let mut cases = vec![
        // In a subnet, nobody there: host / address unreachable.
        ("10.0.1.99", 3, 1),
        ("fd00:0:0:1::99", 1, 3),
        // IPv6 has no default route in this tenant: no route to destination.
        ("2001:db8::1", 1, 0),
    ];
    // A tenant without SNAT has nowhere to send internet traffic.
    let no_snat = POLICY.replace("snat = { public_ip = \"203.0.113.10\" }\n", "");
    for fast in [false, true] {
        for &(dst, ty, code) in &cases {
            let mut p = pipeline(fast, IcmpErrorLimit::default());
            let dst: IpAddr = dst.parse().unwrap();
            let sent = udp_from_a(dst, 64, 20, false);
            let (v, out, _) = run(&mut p, secs(1), A, &sent);
            assert_eq!(v, Verdict::Forward(A), "{dst}");
            assert_error(
                &out,
                &sent,
                (ROUTER, A_MAC),
                router_ip(dst.is_ipv6()),
                ty,
                code,
                0,
            );
            assert_eq!(p.icmp_error_counters().unreachable, 1);
        }
        let policy = Policy::from_toml_str(&no_snat, "no-snat.toml").unwrap();
        let mut p = Pipeline::new(policy, PipelineConfig::default()).unwrap();
        let sent = udp_from_a(IpAddr::V4(INTERNET), 64, 20, false);
        let (v, out, _) = run(&mut p, secs(1), A, &sent);
        assert_eq!(v, Verdict::Forward(A));
        assert_error(&out, &sent, (ROUTER, A_MAC), router_ip(false), 3, 0, 0);
    }
    cases.clear();
}

#[test]
fn no_error_about_an_error_a_later_fragment_or_a_group_address() {
    for fast in [false, true] {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        // An ICMP error with TTL 1: related to nothing here, so dropped before routing; an echo
        // request with TTL 1 is answered.
        let err = FrameBuilder::new()
            .eth(A_MAC, ROUTER)
            .ipv4(Ipv4Addr::new(10, 0, 0, 10), Ipv4Addr::new(10, 0, 1, 11))
            .ttl(1)
            .icmp(3, 3)
            .payload(&[0; 28])
            .build();
        let (v, _, _) = run(&mut p, secs(1), A, &err);
        assert_eq!(v, Verdict::Drop(DropReason::IcmpErrorUnrelated));
        // A fragmented datagram: the first fragment passes with TTL 2, a later one with TTL 1
        // is dropped without an error (RFC 1812 section 4.3.2.7).
        let whole = udp_from_a(b_ip(false), 2, 600, false);
        let frags = ipv4_fragments(&whole, 14, 304, 77);
        assert_eq!(run(&mut p, secs(2), A, &frags[0]).0, Verdict::Forward(B));
        let mut late = frags[1].clone();
        late[14 + 8] = 1;
        late[24..26].copy_from_slice(&[0, 0]);
        let c = checksum::ipv4_header_checksum(&late[14..34]);
        late[24..26].copy_from_slice(&c.to_be_bytes());
        let (v, _, _) = run(&mut p, secs(2), A, &late);
        assert_eq!(v, Verdict::Drop(DropReason::TtlExpired));
        // Nobody at the subnet's broadcast address, but no error to a broadcast.
        let bcast = FrameBuilder::new()
            .eth(A_MAC, MacAddr::BROADCAST)
            .ipv4(Ipv4Addr::new(10, 0, 0, 10), Ipv4Addr::new(10, 0, 0, 255))
            .udp(68, 67)
            .build();
        let (v, _, _) = run(&mut p, secs(3), A, &bcast);
        assert_eq!(v, Verdict::Drop(DropReason::NoSuchVm));
        let c = p.icmp_error_counters();
        assert_eq!((c.suppressed, c.time_exceeded, c.unreachable), (2, 0, 0));
    }
}

#[test]
fn errors_are_rate_limited_per_ingress_port() {
    let limit = IcmpErrorLimit {
        per_sec: 10,
        burst: 3,
    };
    let mut p = pipeline(true, limit);
    let now = Instant(5_000_000_000);
    let expired = |from_b: bool| {
        if from_b {
            FrameBuilder::new()
                .eth(B_MAC, ROUTER)
                .ipv4(Ipv4Addr::new(10, 0, 1, 11), Ipv4Addr::new(10, 0, 0, 10))
                .ttl(1)
                .udp(1, 2)
                .build()
        } else {
            udp_from_a(b_ip(false), 1, 10, false)
        }
    };
    let fates: Vec<Verdict> = (0..5)
        .map(|_| run(&mut p, now, A, &expired(false)).0)
        .collect();
    let answered = Verdict::Forward(A);
    let dropped = Verdict::Drop(DropReason::TtlExpired);
    assert_eq!(fates, [answered, answered, answered, dropped, dropped]);
    // Another port's budget is its own.
    assert_eq!(run(&mut p, now, B, &expired(true)).0, Verdict::Forward(B));
    // One interval later, one more.
    let later = Instant(now.0 + 100_000_000);
    assert_eq!(run(&mut p, later, A, &expired(false)).0, answered);
    assert_eq!(run(&mut p, later, A, &expired(false)).0, dropped);
    let c = p.icmp_error_counters();
    assert_eq!((c.time_exceeded, c.rate_limited), (5, 3));
    assert_eq!(p.drops().get(spillway_vswitch::DropKind::TtlExpired), 3);
}

#[test]
fn a_gso_super_frame_is_checked_by_the_packets_it_will_be_cut_into() {
    use spillway_vswitch::PacketBuf;
    for fast in [false, true] {
        let mut p = pipeline(fast, IcmpErrorLimit::default());
        // 8,000 bytes of TCP payload in one super-frame, as a TAP with TSO hands it over.
        let frame = |to: IpAddr| {
            FrameBuilder::new()
                .eth(A_MAC, ROUTER)
                .ip(a_ip(false), to)
                .dont_frag(true)
                .tcp(40000, 80)
                .tcp_flags(0x02)
                .payload(&vec![7; 8000])
                .build()
        };
        let send = |p: &mut Pipeline, to: IpAddr, gso: u16| {
            let mut buf = PacketBuf::from_frame(&frame(to));
            buf.set_gso_size(gso);
            let v = p.process(secs(1), A, &mut buf);
            (v, buf)
        };
        // Segments of 1,360 payload bytes are 1,400-byte packets: they fit B's port.
        let (v, buf) = send(&mut p, b_ip(false), 1360);
        assert_eq!(v, Verdict::Forward(B), "fast {fast}");
        assert_eq!(buf.gso_size(), 1360, "the offload travels with the frame");
        assert!(!buf.is_generated());
        // One byte more per segment does not; the error is a plain frame.
        let (v, buf) = send(&mut p, b_ip(false), 1361);
        assert_eq!(v, Verdict::Forward(A));
        assert!(buf.is_generated() && buf.gso_size() == 0);
        assert_eq!(&buf.data()[34..36], &[3, 4], "fragmentation needed");
        // Without the GSO size the super-frame itself is measured.
        let (v, _) = send(&mut p, b_ip(false), 0);
        assert_eq!(v, Verdict::Forward(A));
    }
}
