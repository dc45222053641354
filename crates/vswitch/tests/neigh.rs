//! The ARP and IPv6 neighbour-discovery responder, end to end through `Pipeline::process` on
//! the example policy: requests for the router's and peers' addresses are answered with the
//! tenant router's MAC out of the port they came in on, requests for the asker's own address
//! (probes, DAD), foreign and unassigned addresses are consumed silently, announcements are
//! consumed or dropped as spoofed, MLD and router messages are consumed, and malformed ND is
//! dropped with its reason, never a panic. Every reply is checked byte by byte with a parser
//! and a checksum written here, independent of the crate's own wire code, and every outcome by
//! its counter's dotted name; each case runs with the fast path on and off (the SoC slow path
//! and the spill plane run the same pipeline) and must give the same bytes. A counting
//! allocator shows that answering and consuming allocate nothing per packet.

mod common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use common::*;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{DropReason, PacketBuf, PortId, Verdict};
use spillway_wire::MacAddr;
use spillway_wire::build::{FrameBuilder, Ipv6Ext};

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

const WEB_V6: &str = "fd00:1::10";
const WEB2_V6: &str = "fd00:1::11";
/// acme's default router addresses: the first host of 10.1.0.0/16 and of fd00:1::/64.
const ROUTER_V4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const ROUTER_V6: &str = "fd00:1::1";
/// fe80:: + modified EUI-64 of acme's router MAC 02:00:00:00:01:01.
const ROUTER_LL: &str = "fe80::ff:fe00:101";
const WEB_LL: &str = "fe80::ff:fe01:a";

fn v6(s: &str) -> Ipv6Addr {
    s.parse().expect("test address")
}

/// Both pipelines a frame can meet: hardware path (flow entries) and SoC/spill slow path.
fn pipelines() -> [Pipeline; 2] {
    [
        pipeline(PipelineConfig::default()),
        pipeline(PipelineConfig {
            fast_path: false,
            ..PipelineConfig::default()
        }),
    ]
}

/// Runs `frame` from `port` through both pipelines; they must agree on verdict and bytes, and
/// neither may install a flow entry or a connection for it.
fn both(ps: &mut [Pipeline; 2], port: PortId, frame: &[u8]) -> (Verdict, Vec<u8>) {
    let mut out = Vec::new();
    for p in ps.iter_mut() {
        let (flows, conns) = (p.flows().len(), p.conntrack().len());
        let (v, bytes, hit) = run(p, secs(1), port, frame);
        assert!(!hit, "responder traffic never hits a flow entry");
        assert_eq!(
            (p.flows().len(), p.conntrack().len()),
            (flows, conns),
            "no state"
        );
        out.push((v, bytes));
    }
    assert_eq!(out[0], out[1], "fast path on and off agree");
    out.swap_remove(0)
}

/// Counters of `p` by dotted name: the responder's and the drop reasons.
fn counters(p: &Pipeline) -> BTreeMap<&'static str, u64> {
    p.neigh_counters()
        .iter()
        .chain(p.drops().iter())
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn expect_counters(ps: &[Pipeline; 2], want: &[(&'static str, u64)]) {
    for p in ps {
        let want: BTreeMap<_, _> = want.iter().copied().collect();
        assert_eq!(counters(p), want);
    }
}

fn arp(src_mac: MacAddr, op: u16, sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    FrameBuilder::new()
        .eth(src_mac, MacAddr::BROADCAST)
        .arp(op, sender.octets(), MacAddr::ZERO, target.octets())
        .build()
}

/// RFC 1071 over the IPv6 pseudo header and `msg`, written here rather than taken from the
/// wire crate, so that a wrong checksum there cannot pass these tests.
fn icmpv6_sum(src: &[u8], dst: &[u8], msg: &[u8]) -> u16 {
    let mut data = Vec::new();
    data.extend_from_slice(src);
    data.extend_from_slice(dst);
    data.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, 58]);
    data.extend_from_slice(msg);
    if data.len() % 2 == 1 {
        data.push(0);
    }
    let mut s: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An ICMPv6 frame with message `msg` (its checksum filled in), hop limit `hop`, and optional
/// extension headers.
fn icmpv6(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop: u8,
    ext: Option<Ipv6Ext>,
    msg: &[u8],
) -> Vec<u8> {
    let mut m = msg.to_vec();
    m[2..4].fill(0);
    let c = icmpv6_sum(&src.octets(), &dst.octets(), &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let mut b = FrameBuilder::new()
        .eth(src_mac, dst_mac)
        .ipv6(src, dst)
        .ttl(hop);
    if let Some(e) = ext {
        b = b.ipv6_ext(e);
    }
    b.raw(58).payload(&m).build()
}

/// NS or NA body: type, code 0, checksum 0, 4 bytes of flags, target, optional LLA option.
fn neighbor_msg(msg_type: u8, flags: u32, target: Ipv6Addr, lla: Option<(u8, MacAddr)>) -> Vec<u8> {
    let mut m = vec![msg_type, 0, 0, 0];
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&target.octets());
    if let Some((kind, mac)) = lla {
        m.extend_from_slice(&[kind, 1]);
        m.extend_from_slice(&mac.0);
    }
    m
}

fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::from([
        0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// An NS from WEB at `src` for `target`, with WEB's MAC as source link-layer option unless the
/// source is `::`.
fn ns(src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let lla = (!src.is_unspecified()).then_some((1, WEB_MAC));
    let dst = solicited_node(target);
    let o = dst.octets();
    let dst_mac = MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]]);
    icmpv6(
        WEB_MAC,
        dst_mac,
        src,
        dst,
        255,
        None,
        &neighbor_msg(135, 0, target, lla),
    )
}

/// Checks an ARP reply frame field by field: to `asker` at `asker_ip`, from the router MAC for
/// `answered`.
fn assert_arp_reply(frame: &[u8], asker: MacAddr, asker_ip: Ipv4Addr, answered: Ipv4Addr) {
    assert_eq!(frame.len(), 42);
    assert_eq!(&frame[0..6], &asker.0, "to the asker");
    assert_eq!(&frame[6..12], &ACME_ROUTER.0, "from the router");
    assert_eq!(&frame[12..14], &[0x08, 0x06]);
    // htype 1, ptype 0x0800, hlen 6, plen 4, op 2 (reply).
    assert_eq!(&frame[14..22], &[0, 1, 8, 0, 6, 4, 0, 2]);
    assert_eq!(&frame[22..28], &ACME_ROUTER.0, "sender hardware address");
    assert_eq!(
        &frame[28..32],
        &answered.octets(),
        "sender protocol address"
    );
    assert_eq!(&frame[32..38], &asker.0, "target hardware address");
    assert_eq!(
        &frame[38..42],
        &asker_ip.octets(),
        "target protocol address"
    );
}

/// Checks an NA frame: Ethernet to `to_mac` from the router, IPv6 from `target` to `to_ip`
/// with hop limit 255, NA with `flags`, the target, the router MAC option, a valid checksum.
fn assert_na(frame: &[u8], to_mac: MacAddr, to_ip: Ipv6Addr, target: Ipv6Addr, flags: u32) {
    assert_eq!(frame.len(), 14 + 40 + 32);
    assert_eq!(&frame[0..6], &to_mac.0);
    assert_eq!(&frame[6..12], &ACME_ROUTER.0);
    assert_eq!(&frame[12..14], &[0x86, 0xdd]);
    let ip = &frame[14..54];
    assert_eq!(&ip[0..4], &[0x60, 0, 0, 0]);
    assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 32, "payload length");
    assert_eq!((ip[6], ip[7]), (58, 255), "ICMPv6, hop limit 255");
    assert_eq!(
        &ip[8..24],
        &target.octets(),
        "from the address answered for"
    );
    assert_eq!(&ip[24..40], &to_ip.octets());
    let na = &frame[54..];
    assert_eq!((na[0], na[1]), (136, 0));
    assert_eq!(
        icmpv6_sum(&ip[8..24], &ip[24..40], na),
        0,
        "checksum verifies"
    );
    assert_eq!(u32::from_be_bytes([na[4], na[5], na[6], na[7]]), flags);
    assert_eq!(&na[8..24], &target.octets());
    assert_eq!(&na[24..26], &[2, 1], "target link-layer address option");
    assert_eq!(&na[26..32], &ACME_ROUTER.0);
}

const R: u32 = 0x8000_0000;
const S: u32 = 0x4000_0000;
const O: u32 = 0x2000_0000;

#[test]
fn arp_requests_for_the_router_and_peers_are_answered_with_the_router_mac() {
    let mut ps = pipelines();
    for target in [ROUTER_V4, WEB2_IP, DB_IP] {
        let (v, out) = both(&mut ps, WEB, &arp(WEB_MAC, 1, WEB_IP, target));
        assert_eq!(
            v,
            Verdict::Forward(WEB),
            "{target}: back out of the asking port"
        );
        assert_arp_reply(&out, WEB_MAC, WEB_IP, target);
    }
    // A request padded to the Ethernet minimum gets an unpadded 42-byte reply.
    let mut padded = arp(WEB_MAC, 1, WEB_IP, ROUTER_V4);
    padded.resize(60, 0);
    let (_, out) = both(&mut ps, WEB, &padded);
    assert_arp_reply(&out, WEB_MAC, WEB_IP, ROUTER_V4);
    expect_counters(&ps, &[("vswitch.neigh.arp_reply", 4)]);
    for p in &ps {
        assert_eq!(p.counters().forwarded, 4);
    }
}

#[test]
fn arp_for_own_foreign_and_unassigned_addresses_gets_no_answer() {
    let mut ps = pipelines();
    let consumed = Verdict::Drop(DropReason::NeighConsumed);
    // Its own address, as an announcement (sender == target, RFC 5227 section 3) and as a
    // probe (sender 0.0.0.0, section 2.1.1).
    let probe = Ipv4Addr::UNSPECIFIED;
    assert_eq!(
        both(&mut ps, WEB, &arp(WEB_MAC, 1, WEB_IP, WEB_IP)).0,
        consumed
    );
    assert_eq!(
        both(&mut ps, WEB, &arp(WEB_MAC, 1, probe, WEB_IP)).0,
        consumed
    );
    // Outside acme's subnets (routed by the default route, or over the tunnel), unassigned,
    // and a blackholed range.
    for target in [
        REMOTE_VM,
        INTERNET_HOST,
        Ipv4Addr::new(10, 1, 0, 99),
        Ipv4Addr::new(10, 1, 255, 1),
    ] {
        assert_eq!(
            both(&mut ps, WEB, &arp(WEB_MAC, 1, WEB_IP, target)).0,
            consumed,
            "{target}"
        );
    }
    // Tenants are isolated: globex (same address space) does not learn of acme's WEB2.
    let globex = arp(GLOBEX_MAC, 1, WEB_IP, WEB2_IP);
    assert_eq!(both(&mut ps, GLOBEX, &globex).0, consumed);
    // A probe for someone else's address is answered (to 0.0.0.0), so the prober backs off.
    let (v, out) = both(&mut ps, WEB, &arp(WEB_MAC, 1, probe, WEB2_IP));
    assert_eq!(v, Verdict::Forward(WEB));
    assert_arp_reply(&out, WEB_MAC, probe, WEB2_IP);
    expect_counters(
        &ps,
        &[
            ("vswitch.neigh.arp_reply", 1),
            ("vswitch.neigh.consumed", 7),
            ("vswitch.neigh.announce", 1),
            ("vswitch.neigh.own_target", 1),
            ("vswitch.neigh.unanswered", 5),
            ("vswitch.drop.neigh_consumed", 7),
        ],
    );
}

#[test]
fn gratuitous_arp_is_consumed_and_a_spoofed_one_dropped() {
    let mut ps = pipelines();
    let consumed = Verdict::Drop(DropReason::NeighConsumed);
    // Announcement (request, sender == target) and gratuitous reply for its own address.
    assert_eq!(
        both(&mut ps, WEB, &arp(WEB_MAC, 1, WEB_IP, WEB_IP)).0,
        consumed
    );
    assert_eq!(
        both(&mut ps, WEB, &arp(WEB_MAC, 2, WEB_IP, WEB_IP)).0,
        consumed
    );
    // Claiming WEB2's address, or the router's.
    for ip in [WEB2_IP, ROUTER_V4] {
        assert_eq!(
            both(&mut ps, WEB, &arp(WEB_MAC, 1, ip, ip)).0,
            Verdict::Drop(DropReason::SpoofedIp)
        );
    }
    // Its own address with another MAC, in the Ethernet header and in the ARP sender field.
    let mut other = arp(WEB2_MAC, 1, WEB_IP, WEB_IP);
    assert_eq!(
        both(&mut ps, WEB, &other).0,
        Verdict::Drop(DropReason::SpoofedMac)
    );
    other[6..12].copy_from_slice(&WEB_MAC.0);
    assert_eq!(
        both(&mut ps, WEB, &other).0,
        Verdict::Drop(DropReason::SpoofedMac)
    );
    expect_counters(
        &ps,
        &[
            // Sender == target is an announcement even in a request: RFC 5227 section 3.
            ("vswitch.neigh.announce", 2),
            ("vswitch.neigh.consumed", 2),
            ("vswitch.drop.neigh_consumed", 2),
            ("vswitch.drop.spoofed_ip", 2),
            ("vswitch.drop.spoofed_mac", 2),
        ],
    );
}

#[test]
fn neighbor_solicitations_for_the_router_and_peers_are_answered() {
    let mut ps = pipelines();
    // Global router address, from the global address.
    let (v, out) = both(&mut ps, WEB, &ns(v6(WEB_V6), v6(ROUTER_V6)));
    assert_eq!(v, Verdict::Forward(WEB));
    assert_na(&out, WEB_MAC, v6(WEB_V6), v6(ROUTER_V6), R | S | O);
    // The router's link-local address (a default route "via fe80::..."), from link-local.
    let (v, out) = both(&mut ps, WEB, &ns(v6(WEB_LL), v6(ROUTER_LL)));
    assert_eq!(v, Verdict::Forward(WEB));
    assert_na(&out, WEB_MAC, v6(WEB_LL), v6(ROUTER_LL), R | S | O);
    // A peer on the subnet (proxy), asked by unicast NUD to the router MAC.
    let nud = icmpv6(
        WEB_MAC,
        ACME_ROUTER,
        v6(WEB_V6),
        v6(WEB2_V6),
        255,
        None,
        &neighbor_msg(135, 0, v6(WEB2_V6), Some((1, WEB_MAC))),
    );
    let (v, out) = both(&mut ps, WEB, &nud);
    assert_eq!(v, Verdict::Forward(WEB));
    assert_na(&out, WEB_MAC, v6(WEB_V6), v6(WEB2_V6), R | S | O);
    // An IPv4-mapped target is no IPv6 neighbour, though it spells the router's IPv4 address.
    assert_eq!(
        both(&mut ps, WEB, &ns(v6(WEB_V6), v6("::ffff:10.1.0.1"))).0,
        Verdict::Drop(DropReason::NeighConsumed)
    );
    expect_counters(
        &ps,
        &[
            ("vswitch.neigh.na_reply", 3),
            ("vswitch.neigh.unanswered", 1),
            ("vswitch.neigh.consumed", 1),
            ("vswitch.drop.neigh_consumed", 1),
        ],
    );
    // The regression this fixes: none of it is `icmp_untracked` any more.
    for p in &ps {
        assert_eq!(p.drops().get(spillway_vswitch::DropKind::IcmpUntracked), 0);
    }
}

#[test]
fn dad_for_its_own_address_meets_silence_and_for_a_taken_one_an_advertisement() {
    let mut ps = pipelines();
    let any = Ipv6Addr::UNSPECIFIED;
    assert_eq!(
        both(&mut ps, WEB, &ns(any, v6(WEB_V6))).0,
        Verdict::Drop(DropReason::NeighConsumed)
    );
    // Its link-local address (chosen by the guest, not in the policy) is nobody else's either.
    assert_eq!(
        both(&mut ps, WEB, &ns(any, v6("fe80::1234"))).0,
        Verdict::Drop(DropReason::NeighConsumed)
    );
    // DAD for WEB2's address: RFC 4861 section 7.2.4, an unsolicited NA to all-nodes.
    let (v, out) = both(&mut ps, WEB, &ns(any, v6(WEB2_V6)));
    assert_eq!(v, Verdict::Forward(WEB));
    let all_nodes = v6("ff02::1");
    assert_na(
        &out,
        MacAddr([0x33, 0x33, 0, 0, 0, 1]),
        all_nodes,
        v6(WEB2_V6),
        R | O,
    );
    expect_counters(
        &ps,
        &[
            ("vswitch.neigh.na_reply", 1),
            ("vswitch.neigh.consumed", 2),
            ("vswitch.neigh.own_target", 1),
            ("vswitch.neigh.unanswered", 1),
            ("vswitch.drop.neigh_consumed", 2),
        ],
    );
}

#[test]
fn unsolicited_advertisements_rs_ra_and_mld_are_consumed() {
    let mut ps = pipelines();
    let consumed = Verdict::Drop(DropReason::NeighConsumed);
    let all_nodes = v6("ff02::1");
    let mc = MacAddr([0x33, 0x33, 0, 0, 0, 1]);
    let na = |target: &str, lla: MacAddr| {
        icmpv6(
            WEB_MAC,
            mc,
            v6(WEB_LL),
            all_nodes,
            255,
            None,
            &neighbor_msg(136, O, v6(target), Some((2, lla))),
        )
    };
    assert_eq!(both(&mut ps, WEB, &na(WEB_V6, WEB_MAC)).0, consumed);
    assert_eq!(
        both(&mut ps, WEB, &na(WEB2_V6, WEB_MAC)).0,
        Verdict::Drop(DropReason::SpoofedIp)
    );
    assert_eq!(
        both(&mut ps, WEB, &na(WEB_V6, WEB2_MAC)).0,
        Verdict::Drop(DropReason::SpoofedMac)
    );
    let all_routers = v6("ff02::2");
    let rs = icmpv6(
        WEB_MAC,
        MacAddr([0x33, 0x33, 0, 0, 0, 2]),
        v6(WEB_LL),
        all_routers,
        255,
        None,
        &[133, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 1, 0, 0x0a],
    );
    assert_eq!(both(&mut ps, WEB, &rs).0, consumed);
    let mut ra = vec![134, 0, 0, 0, 64, 0, 0x07, 0x08];
    ra.extend_from_slice(&[0; 8]);
    let ra = icmpv6(WEB_MAC, mc, v6(WEB_LL), all_nodes, 255, None, &ra);
    assert_eq!(both(&mut ps, WEB, &ra).0, consumed);
    // An MLDv2 report with its hop-by-hop router alert (RFC 3810 section 5), hop limit 1.
    let mut report = vec![143, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0];
    report.extend_from_slice(&v6("ff02::1:ff00:10").octets());
    let mld = icmpv6(
        WEB_MAC,
        MacAddr([0x33, 0x33, 0, 0, 0, 0x16]),
        v6(WEB_LL),
        v6("ff02::16"),
        1,
        Some(Ipv6Ext::HopByHop(vec![5, 2, 0, 0, 1, 0])),
        &report,
    );
    assert_eq!(both(&mut ps, WEB, &mld).0, consumed);
    expect_counters(
        &ps,
        &[
            ("vswitch.neigh.announce", 1),
            ("vswitch.neigh.router_solicit", 1),
            ("vswitch.neigh.router_msg", 1),
            ("vswitch.neigh.mld", 1),
            ("vswitch.neigh.consumed", 4),
            ("vswitch.drop.neigh_consumed", 4),
            ("vswitch.drop.spoofed_ip", 1),
            ("vswitch.drop.spoofed_mac", 1),
        ],
    );
}

#[test]
fn malformed_neighbor_discovery_is_dropped_with_a_reason() {
    let mut ps = pipelines();
    let malformed = Verdict::Drop(DropReason::NeighMalformed);
    let good = ns(v6(WEB_V6), v6(ROUTER_V6));
    // RFC 4861 section 7.1.1: hop limit 255 only.
    let mut hop = good.clone();
    hop[21] = 64;
    assert_eq!(both(&mut ps, WEB, &hop).0, malformed);
    // A bad checksum.
    let mut sum = good.clone();
    sum[56] ^= 1;
    assert_eq!(both(&mut ps, WEB, &sum).0, malformed);
    // Shorter than 24 bytes, a zero-length option, an option past the end, a multicast target,
    // a non-zero code.
    let src = v6(WEB_V6);
    let dst = solicited_node(v6(ROUTER_V6));
    let send = |m: &[u8]| icmpv6(WEB_MAC, ACME_ROUTER, src, dst, 255, None, m);
    let body = neighbor_msg(135, 0, v6(ROUTER_V6), Some((1, WEB_MAC)));
    let mut zero_opt = body.clone();
    zero_opt[25] = 0;
    let mut long_opt = body.clone();
    long_opt[25] = 2;
    let mut code = body.clone();
    code[1] = 1;
    let mc_target = neighbor_msg(135, 0, v6("ff02::1"), None);
    for m in [&body[..20], &zero_opt, &long_opt, &code, &mc_target] {
        assert_eq!(both(&mut ps, WEB, &send(m)).0, malformed, "{m:?}");
    }
    // DAD with a source link-layer option, or not to the solicited-node address.
    let any = Ipv6Addr::UNSPECIFIED;
    let dad_lla = icmpv6(WEB_MAC, ACME_ROUTER, any, dst, 255, None, &body);
    let dad_dst = icmpv6(
        WEB_MAC,
        ACME_ROUTER,
        any,
        v6(ROUTER_V6),
        255,
        None,
        &neighbor_msg(135, 0, v6(ROUTER_V6), None),
    );
    assert_eq!(both(&mut ps, WEB, &dad_lla).0, malformed);
    assert_eq!(both(&mut ps, WEB, &dad_dst).0, malformed);
    // RFC 6980: ND in a fragment.
    let frag = FrameBuilder::new()
        .eth(WEB_MAC, ACME_ROUTER)
        .ipv6(src, dst)
        .ttl(255)
        .ipv6_ext(Ipv6Ext::Fragment {
            offset: 0,
            more: true,
            ident: 7,
        })
        .icmp(135, 0)
        .payload(&v6(ROUTER_V6).octets())
        .build();
    assert_eq!(both(&mut ps, WEB, &frag).0, malformed);
    // A truncated ARP packet is rejected by the parser.
    let arp_short = &arp(WEB_MAC, 1, WEB_IP, ROUTER_V4)[..30];
    assert!(matches!(
        both(&mut ps, WEB, arp_short).0,
        Verdict::Drop(DropReason::Malformed(_))
    ));
    expect_counters(
        &ps,
        &[
            ("vswitch.drop.neigh_malformed", 10),
            ("vswitch.drop.malformed", 1),
        ],
    );
}

#[test]
fn arbitrary_bytes_after_an_nd_header_never_panic() {
    // Every truncation and every single-byte corruption of an NS and of an ARP request.
    let mut p = pipeline(PipelineConfig::default());
    for f in [
        ns(v6(WEB_V6), v6(ROUTER_V6)),
        arp(WEB_MAC, 1, WEB_IP, ROUTER_V4),
    ] {
        for len in 0..=f.len() {
            let _ = run(&mut p, secs(1), WEB, &f[..len]);
        }
        for i in 0..f.len() {
            for b in [0u8, 1, 0x80, 0xff] {
                let mut g = f.clone();
                g[i] = b;
                let _ = run(&mut p, secs(1), WEB, &g);
            }
        }
    }
}

#[test]
fn arp_on_the_uplink_is_not_answered() {
    let mut p = pipeline(PipelineConfig::default());
    let f = arp(GATEWAY_MAC, 1, Ipv4Addr::new(192, 0, 2, 254), VTEP);
    assert_eq!(
        run(&mut p, secs(1), UPLINK, &f).0,
        Verdict::Drop(DropReason::ArpNotRouted)
    );
    assert_eq!(p.neigh_counters().arp_reply, 0);
}

#[test]
fn configured_router_addresses_replace_the_default() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/policy-basic.toml"
    ))
    .expect("example policy");
    let text = text.replacen(
        "subnets = [\"10.1.0.0/16\", \"fd00:1::/64\"]",
        "subnets = [\"10.1.0.0/16\", \"fd00:1::/64\"]\nrouter_ips = [\"10.1.255.254\"]",
        1,
    );
    let policy = Policy::from_toml_str(&text, "router.toml").expect("valid");
    let mut p = Pipeline::new(policy, PipelineConfig::default()).expect("pipeline");
    let gw = Ipv4Addr::new(10, 1, 255, 254);
    let (v, out, _) = run(&mut p, secs(1), WEB, &arp(WEB_MAC, 1, WEB_IP, gw));
    assert_eq!(v, Verdict::Forward(WEB));
    assert_arp_reply(&out, WEB_MAC, WEB_IP, gw);
    // 10.1.0.1 is no longer the router's, and no VM holds it.
    let (v, _, _) = run(&mut p, secs(1), WEB, &arp(WEB_MAC, 1, WEB_IP, ROUTER_V4));
    assert_eq!(v, Verdict::Drop(DropReason::NeighConsumed));
    // Nor is fd00:1::1: the list replaces every default.
    let mut buf = PacketBuf::from_frame(&ns(v6(WEB_V6), v6(ROUTER_V6)));
    assert_eq!(
        p.process(secs(1), WEB, &mut buf),
        Verdict::Drop(DropReason::NeighConsumed)
    );
}

#[test]
fn answering_and_consuming_allocate_nothing_per_packet() {
    let mut p = pipeline(PipelineConfig::default());
    let frames = [
        arp(WEB_MAC, 1, WEB_IP, ROUTER_V4),
        arp(WEB_MAC, 1, WEB_IP, WEB_IP),
        ns(v6(WEB_V6), v6(ROUTER_V6)),
        ns(Ipv6Addr::UNSPECIFIED, v6(WEB_V6)),
    ];
    let mut buf = PacketBuf::with_capacity(2048);
    let mut round = |p: &mut Pipeline| {
        for f in &frames {
            buf.load(f).expect("fits");
            p.process(secs(1), WEB, &mut buf);
        }
    };
    round(&mut p);
    let before = spillway_testkit::allocations();
    for _ in 0..1000 {
        round(&mut p);
    }
    assert_eq!(spillway_testkit::allocations() - before, 0);
    assert_eq!(p.neigh_counters().arp_reply, 1001);
    assert_eq!(p.neigh_counters().na_reply, 1001);
}
