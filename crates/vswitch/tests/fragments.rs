//! Fragmented traffic through the pipeline over the shipped example policy: whole IPv4 and IPv6
//! datagrams built with `FrameBuilder` are cut into fragments here (a tiny independent
//! fragmenter), offered in order, out of order, overlapping, late or too many, and the verdicts,
//! drop reasons and `vswitch.frag.*` counters are asserted. Where fragments are forwarded, the
//! outputs are reassembled by the test and the whole datagram's checksums verified: that proves
//! SNAT's incremental update on the first fragment plus the IP-only rewrite of later fragments
//! leave a datagram the receiver accepts. Security groups must apply as to unfragmented traffic:
//! a later fragment never reaches a VM whose rules denied (or never saw) its first fragment.

mod common;

use common::*;
use spillway_vswitch::frag::FragConfig;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::{DropReason, PortId, Verdict};
use spillway_wire::build::FrameBuilder;
use spillway_wire::{checksum, ip_proto};
use std::net::Ipv4Addr;

fn fragment(frame: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    let id = u16::from_be_bytes([frame[18], frame[19]]);
    ipv4_fragments(frame, 14, chunk, id)
}

/// Reassembles forwarded IPv4 fragments (at `l3` in each frame) into the datagram's IP header
/// source/destination and its transport bytes.
fn reassemble(frames: &[Vec<u8>], l3: usize) -> ([u8; 4], [u8; 4], u8, Vec<u8>) {
    let mut data = Vec::new();
    let mut first = None;
    for f in frames {
        let ip = &f[l3..];
        assert!(
            checksum::ipv4_header_valid(&ip[..20]),
            "fragment header checksum"
        );
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let off = usize::from(u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff) * 8;
        let part = &ip[20..total];
        if data.len() < off + part.len() {
            data.resize(off + part.len(), 0);
        }
        data[off..off + part.len()].copy_from_slice(part);
        if off == 0 {
            first = Some((
                [ip[12], ip[13], ip[14], ip[15]],
                [ip[16], ip[17], ip[18], ip[19]],
                ip[9],
            ));
        }
    }
    let (s, d, p) = first.expect("a first fragment");
    (s, d, p, data)
}

fn big_udp(
    src_mac: spillway_wire::MacAddr,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    id: u16,
) -> Vec<u8> {
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    FrameBuilder::new()
        .eth(src_mac, ACME_ROUTER)
        .ipv4(src.0, dst.0)
        .ident(id)
        .udp(src.1, dst.1)
        .payload(&payload)
        .build()
}

fn run_all(
    p: &mut Pipeline,
    now: spillway_vswitch::Instant,
    port: PortId,
    frames: &[Vec<u8>],
) -> Vec<(Verdict, Vec<u8>)> {
    frames
        .iter()
        .map(|f| {
            let (v, out, fast) = run(p, now, port, f);
            assert!(!fast, "fragments always take the slow path");
            (v, out)
        })
        .collect()
}

#[test]
fn snat_udp_fragments_are_forwarded_and_reassemble_with_valid_checksums() {
    let mut p = pipeline(PipelineConfig::default());
    let frags = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 5353), (INTERNET_HOST, 53), 0x4242),
        1480,
    );
    assert_eq!(frags.len(), 3);
    let out = run_all(&mut p, secs(1), WEB, &frags);
    assert!(
        out.iter().all(|(v, _)| *v == Verdict::Forward(UPLINK)),
        "{out:?}"
    );
    let outs: Vec<Vec<u8>> = out.into_iter().map(|(_, o)| o).collect();
    let (s, d, proto, l4) = reassemble(&outs, 14);
    assert_eq!(
        (s, d, proto),
        (ACME_PUBLIC.octets(), INTERNET_HOST.octets(), ip_proto::UDP)
    );
    assert_eq!(
        u16::from_be_bytes([l4[0], l4[1]]),
        1024,
        "source port translated"
    );
    assert!(
        checksum::verify_l4_v4(s, d, proto, &l4),
        "UDP checksum of the whole datagram"
    );
    let c = p.frag_counters();
    assert_eq!(
        (c.tracked, c.followed, c.completed, c.expired),
        (1, 2, 1, 0)
    );

    // The fragmented answer comes back on the uplink to the SNAT address.
    let back = FrameBuilder::new()
        .eth(GATEWAY_MAC, UPLINK_MAC)
        .ipv4(INTERNET_HOST, ACME_PUBLIC)
        .ident(7)
        .udp(53, 1024)
        .payload(&[0x5a; 2000])
        .build();
    let out = run_all(&mut p, secs(2), UPLINK, &fragment(&back, 1200));
    assert!(
        out.iter().all(|(v, _)| *v == Verdict::Forward(WEB)),
        "{out:?}"
    );
    let outs: Vec<Vec<u8>> = out.into_iter().map(|(_, o)| o).collect();
    let (s, d, proto, l4) = reassemble(&outs, 14);
    assert_eq!(
        d,
        WEB_IP.octets(),
        "destination translated back on every fragment"
    );
    assert_eq!(u16::from_be_bytes([l4[2], l4[3]]), 5353);
    assert!(checksum::verify_l4_v4(s, d, proto, &l4));
    assert!(p.frag_counters().completed == 2);
}

#[test]
fn a_denied_first_fragment_takes_its_later_fragments_with_it() {
    let mut p = pipeline(PipelineConfig::default());
    // DB admits only TCP 5432 (and ICMP) from acme: UDP is denied by default.
    let frags = fragment(&big_udp(WEB_MAC, (WEB_IP, 999), (DB_IP, 5432), 1), 1480);
    let out = run_all(&mut p, secs(1), WEB, &frags);
    assert_eq!(
        out[0].0,
        Verdict::Drop(DropReason::SecurityGroupDefaultDeny)
    );
    for (v, _) in &out[1..] {
        assert_eq!(*v, Verdict::Drop(DropReason::FragmentNoFirst));
    }
    // A later fragment on its own, for a datagram nobody started, is dropped too.
    let lone = &fragment(&big_udp(WEB_MAC, (WEB_IP, 999), (WEB2_IP, 80), 2), 1480)[1];
    assert_eq!(
        run(&mut p, secs(1), WEB, lone).0,
        Verdict::Drop(DropReason::FragmentNoFirst)
    );
    // Nor does an admitted connection open the door for another datagram's later fragments:
    // the tracking key includes the identification.
    let ok = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 999), (INTERNET_HOST, 53), 3),
        1480,
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &ok[0]).0,
        Verdict::Forward(UPLINK)
    );
    let other = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 999), (INTERNET_HOST, 53), 4),
        1480,
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &other[1]).0,
        Verdict::Drop(DropReason::FragmentNoFirst)
    );
    assert_eq!(
        p.drops().get(spillway_vswitch::DropKind::FragmentNoFirst),
        4
    );
}

#[test]
fn overlapping_fragments_poison_the_datagram() {
    let mut p = pipeline(PipelineConfig::default());
    let frags = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 5000), (INTERNET_HOST, 53), 9),
        1480,
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &frags[0]).0,
        Verdict::Forward(UPLINK)
    );
    // RFC 1858: offset 1 (8 bytes) would rewrite the first fragment's bytes at the receiver.
    let mut evil = frags[1].clone();
    evil[20..22].copy_from_slice(&(0x2000u16 | 1).to_be_bytes());
    evil[24..26].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(&evil[14..34]);
    evil[24..26].copy_from_slice(&c.to_be_bytes());
    assert_eq!(
        run(&mut p, secs(1), WEB, &evil).0,
        Verdict::Drop(DropReason::FragmentOverlap)
    );
    // The rest of the datagram is dropped as well (RFC 5722).
    for f in &frags[1..] {
        assert_eq!(
            run(&mut p, secs(1), WEB, f).0,
            Verdict::Drop(DropReason::FragmentOverlap)
        );
    }
    // A duplicated first fragment overlaps too.
    let again = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 5000), (INTERNET_HOST, 53), 10),
        1480,
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &again[0]).0,
        Verdict::Forward(UPLINK)
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &again[0]).0,
        Verdict::Drop(DropReason::FragmentOverlap)
    );
}

#[test]
fn out_of_order_late_and_excess_fragments_are_counted_drops() {
    let cfg = PipelineConfig {
        frag: FragConfig {
            fragments_max: 2,
            ..FragConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = pipeline(cfg);
    let frags = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 5000), (INTERNET_HOST, 53), 1),
        1000,
    );
    assert_eq!(frags.len(), 4);
    // A later fragment before its first: dropped, not held.
    assert_eq!(
        run(&mut p, secs(1), WEB, &frags[2]).0,
        Verdict::Drop(DropReason::FragmentNoFirst)
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &frags[0]).0,
        Verdict::Forward(UPLINK)
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &frags[1]).0,
        Verdict::Forward(UPLINK)
    );
    // The third fragment exceeds `fragments_max` = 2.
    assert_eq!(
        run(&mut p, secs(1), WEB, &frags[3]).0,
        Verdict::Drop(DropReason::FragmentTooMany)
    );

    // Timeout: 10 s from the first fragment by default.
    let late = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 5000), (INTERNET_HOST, 53), 2),
        1480,
    );
    assert_eq!(
        run(&mut p, secs(20), WEB, &late[0]).0,
        Verdict::Forward(UPLINK)
    );
    assert_eq!(
        run(&mut p, secs(31), WEB, &late[1]).0,
        Verdict::Drop(DropReason::FragmentTimeout)
    );
    assert_eq!(p.frag_counters().expired, 1);
}

#[test]
fn a_zone_over_its_budget_is_refused_until_its_datagrams_expire() {
    let cfg = PipelineConfig {
        frag: FragConfig {
            entries_max: 16,
            zone_entries_max: 2,
            ..FragConfig::default()
        },
        ..PipelineConfig::default()
    };
    let mut p = pipeline(cfg);
    let first = |id| {
        fragment(
            &big_udp(WEB_MAC, (WEB_IP, 5000), (INTERNET_HOST, 53), id),
            1480,
        )[0]
        .clone()
    };
    assert_eq!(
        run(&mut p, secs(1), WEB, &first(1)).0,
        Verdict::Forward(UPLINK)
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &first(2)).0,
        Verdict::Forward(UPLINK)
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &first(3)).0,
        Verdict::Drop(DropReason::FragmentTableFull)
    );
    // Another VM (another zone) still has room.
    let web2 = fragment(
        &big_udp(WEB2_MAC, (WEB2_IP, 5000), (INTERNET_HOST, 53), 3),
        1480,
    );
    assert_eq!(
        run(&mut p, secs(1), WEB2, &web2[0]).0,
        Verdict::Forward(UPLINK)
    );
    // After the timeout the stale datagrams are reclaimed.
    assert_eq!(
        run(&mut p, secs(12), WEB, &first(3)).0,
        Verdict::Forward(UPLINK)
    );
    assert_eq!(
        p.frag_counters().expired,
        3,
        "the scan reclaims every expired datagram, WEB2's too"
    );
}

#[test]
fn later_fragments_with_another_source_mac_are_spoofed() {
    let mut p = pipeline(PipelineConfig::default());
    let frags = fragment(
        &big_udp(WEB_MAC, (WEB_IP, 5000), (INTERNET_HOST, 53), 1),
        1480,
    );
    assert_eq!(
        run(&mut p, secs(1), WEB, &frags[0]).0,
        Verdict::Forward(UPLINK)
    );
    let mut f = frags[1].clone();
    f[6..12].copy_from_slice(&WEB2_MAC.0);
    assert_eq!(
        run(&mut p, secs(1), WEB, &f).0,
        Verdict::Drop(DropReason::SpoofedMac)
    );
}

#[test]
fn inner_fragments_over_vxlan_follow_the_ingress_rules_outer_fragments_are_dropped() {
    let mut p = pipeline(PipelineConfig::default());
    // acme's SG 3 admits TCP 22 from 10.2.0.0/16 into WEB.
    let seg = FrameBuilder::new()
        .eth(spillway_wire::MacAddr([2, 0, 0, 0, 9, 9]), ACME_ROUTER)
        .ipv4(REMOTE_VM, WEB_IP)
        .ident(77)
        .tcp(40000, 22)
        .tcp_flags(SYN)
        .payload(&[1; 1500])
        .build();
    let frags: Vec<Vec<u8>> = fragment(&seg, 800)
        .iter()
        .map(|f| vxlan(f, REMOTE_VTEP, VTEP, ACME_VNI))
        .collect();
    let out = run_all(&mut p, secs(1), UPLINK, &frags);
    assert!(
        out.iter().all(|(v, _)| *v == Verdict::Forward(WEB)),
        "{out:?}"
    );
    let outs: Vec<Vec<u8>> = out.into_iter().map(|(_, o)| o).collect();
    let (s, d, proto, l4) = reassemble(&outs, 14);
    assert!(
        checksum::verify_l4_v4(s, d, proto, &l4),
        "decapsulated datagram intact"
    );
    for o in &outs {
        assert_eq!(&o[0..6], &WEB_MAC.0, "delivered to WEB's MAC");
    }
    // The same to port 23 is denied by default on the first fragment; the rest follow it.
    let seg23 = FrameBuilder::new()
        .eth(spillway_wire::MacAddr([2, 0, 0, 0, 9, 9]), ACME_ROUTER)
        .ipv4(REMOTE_VM, WEB_IP)
        .ident(78)
        .tcp(40000, 23)
        .tcp_flags(SYN)
        .payload(&[1; 1500])
        .build();
    let out = run_all(
        &mut p,
        secs(1),
        UPLINK,
        &fragment(&seg23, 800)
            .iter()
            .map(|f| vxlan(f, REMOTE_VTEP, VTEP, ACME_VNI))
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        out[0].0,
        Verdict::Drop(DropReason::SecurityGroupDefaultDeny)
    );
    assert!(
        out[1..]
            .iter()
            .all(|(v, _)| *v == Verdict::Drop(DropReason::FragmentNoFirst))
    );

    // Outer-fragmented VXLAN to our VTEP is not reassembled.
    let whole = vxlan(&seg, REMOTE_VTEP, VTEP, ACME_VNI);
    for f in fragment(&whole, 1000) {
        assert_eq!(
            run(&mut p, secs(2), UPLINK, &f).0,
            Verdict::Drop(DropReason::Fragment)
        );
    }
}

/// Cuts an Ethernet + IPv6 frame whose fixed header is followed directly by a fragment header
/// (built as an atomic fragment) into fragments of at most `chunk` bytes of fragmentable data.
fn ipv6_fragments(frame: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    assert_eq!(frame[20], 44, "a fragment header follows the fixed header");
    let (head, data) = (&frame[..62], &frame[62..]);
    data.chunks(chunk)
        .enumerate()
        .map(|(i, part)| {
            let mut f = head.to_vec();
            f[18..20].copy_from_slice(&((8 + part.len()) as u16).to_be_bytes());
            let more = (i + 1) * chunk < data.len();
            let fo = (((i * chunk / 8) as u16) << 3) | u16::from(more);
            f[56..58].copy_from_slice(&fo.to_be_bytes());
            f.extend_from_slice(part);
            f
        })
        .collect()
}

#[test]
fn ipv6_fragments_follow_the_first_and_denied_ones_do_not() {
    let mut p = pipeline(PipelineConfig::default());
    let web: std::net::Ipv6Addr = "fd00:1::10".parse().expect("literal");
    let web2: std::net::Ipv6Addr = "fd00:1::11".parse().expect("literal");
    let seg = |dport: u16, ident: u32| {
        FrameBuilder::new()
            .eth(WEB_MAC, ACME_ROUTER)
            .ipv6(web, web2)
            .ipv6_ext(spillway_wire::build::Ipv6Ext::Fragment {
                offset: 0,
                more: false,
                ident,
            })
            .tcp(40000, dport)
            .tcp_flags(SYN)
            .payload(&[6; 100])
            .build()
    };
    // acme's SG 1 admits TCP 443 from ::/0 into WEB2.
    let frags = ipv6_fragments(&seg(443, 0x1111_2222), 64);
    assert_eq!(frags.len(), 2);
    let out = run_all(&mut p, secs(1), WEB, &frags);
    assert!(
        out.iter().all(|(v, _)| *v == Verdict::Forward(WEB2)),
        "{out:?}"
    );
    assert_eq!(p.frag_counters().completed, 1);
    // Port 22 is not admitted from WEB: the first fragment is denied, the last follows it.
    let out = run_all(&mut p, secs(1), WEB, &ipv6_fragments(&seg(22, 7), 64));
    assert_eq!(
        out[0].0,
        Verdict::Drop(DropReason::SecurityGroupDefaultDeny)
    );
    assert_eq!(out[1].0, Verdict::Drop(DropReason::FragmentNoFirst));
}
