//! Golden-byte tests: hand-written frames (bytes and checksums worked out independently of this
//! crate, with a separate script using the RFC 1071 algorithm) are parsed field by field, and the
//! builders must reproduce them byte for byte. This pins the wire format against our own
//! round-trip tests, which could agree with themselves while both being wrong.

use spillway_wire::build::{FrameBuilder, Ipv6Ext, VxlanOuter};
use spillway_wire::checksum;
use spillway_wire::{
    ErrorKind, Fragment, FragmentFields, IpAddr16, L3, Layer, MacAddr, ParseOptions, Vni, ip_proto,
    parse_frame,
};

/// VLAN 100 / IPv4 10.0.0.1 -> 10.0.0.2, DF, id 0x1234, TTL 64 / TCP 40000 -> 80, PSH|ACK,
/// seq 1000, ack 2000 / "hello".
const IPV4_TCP: [u8; 63] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x81, 0x00, 0x00, 0x64,
    0x08, 0x00, 0x45, 0x00, 0x00, 0x2d, 0x12, 0x34, 0x40, 0x00, 0x40, 0x06, 0x14, 0x95, 0x0a, 0x00,
    0x00, 0x01, 0x0a, 0x00, 0x00, 0x02, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00,
    0x07, 0xd0, 0x50, 0x18, 0xff, 0xff, 0xaf, 0xaa, 0x00, 0x00, 0x68, 0x65, 0x6c, 0x6c, 0x6f,
];

/// IPv4 10.0.0.1 -> 10.0.0.2, id 0xbeef, MF, offset 0, TTL 64 / UDP 5353 -> 53 with length
/// 1480 (the whole datagram) and checksum 0x1234 / "EDNS0-ok": the first fragment of a large
/// DNS answer, 8 of its 1472 payload bytes present.
const IPV4_UDP_FIRST_FRAGMENT: [u8; 50] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x45, 0x00,
    0x00, 0x24, 0xbe, 0xef, 0x20, 0x00, 0x40, 0x11, 0x87, 0xd7, 0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00,
    0x00, 0x02, 0x14, 0xe9, 0x00, 0x35, 0x05, 0xc8, 0x12, 0x34, 0x45, 0x44, 0x4e, 0x53, 0x30, 0x2d,
    0x6f, 0x6b,
];

/// IPv6 2001:db8::1 -> 2001:db8::2, hop limit 255, hop-by-hop (8) / routing (8) / fragment
/// (offset 0, M = 1, id 0xabcdef01) / destination options (8) / UDP 5353 -> 53 / "abcd".
const IPV6_EXT_UDP: [u8; 98] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x86, 0xdd, 0x60, 0x00,
    0x00, 0x00, 0x00, 0x2c, 0x00, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x2b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x00, 0x01, 0xab, 0xcd, 0xef, 0x01, 0x11, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0xe9, 0x00, 0x35, 0x00, 0x0c, 0xca, 0x7c, 0x61, 0x62,
    0x63, 0x64,
];

/// Outer 02:..:aa -> 02:..:bb / IPv4 10.0.0.1 -> 10.0.0.2 DF / UDP 49152 -> 4789, checksum 0 /
/// VXLAN VNI 0x123456 / inner IPv4 192.168.0.1 -> 192.168.0.2 / ICMP echo request id 7 seq 1
/// / "ping".
const VXLAN_ICMP: [u8; 96] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0xbb, 0x02, 0x00, 0x00, 0x00, 0x00, 0xaa, 0x08, 0x00, 0x45, 0x00,
    0x00, 0x52, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x26, 0x99, 0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00,
    0x00, 0x02, 0xc0, 0x00, 0x12, 0xb5, 0x00, 0x3e, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x12, 0x34,
    0x56, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00,
    0x45, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x40, 0x01, 0xf9, 0x89, 0xc0, 0xa8, 0x00, 0x01,
    0xc0, 0xa8, 0x00, 0x02, 0x08, 0x00, 0x19, 0x27, 0x00, 0x07, 0x00, 0x01, 0x70, 0x69, 0x6e, 0x67,
];

fn v6(last: u8) -> [u8; 16] {
    let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    a[15] = last;
    a
}

#[test]
fn golden_ipv4_tcp_parses_every_field() {
    let p = parse_frame(&IPV4_TCP, &ParseOptions::default()).expect("valid frame");
    assert!(p.vxlan.is_none() && p.inner.is_none());
    let h = p.outer;
    assert_eq!(h.dst_mac, MacAddr([2, 0, 0, 0, 0, 2]));
    assert_eq!(h.src_mac, MacAddr([2, 0, 0, 0, 0, 1]));
    assert_eq!((h.vlan_count, h.vlans[0], h.ethertype), (1, 100, 0x0800));
    assert_eq!((h.l3, h.l3_offset, h.l3_len), (L3::Ipv4, 18, 45));
    assert_eq!((h.l4_offset, h.payload_offset, h.payload_len), (38, 58, 5));
    assert_eq!((h.tcp_flags, h.ttl, h.fragment), (0x18, 64, Fragment::None));
    let k = h.key.expect("ip has a key");
    assert_eq!(k.src_ip, IpAddr16::from_v4([10, 0, 0, 1]));
    assert_eq!(k.dst_ip, IpAddr16::from_v4([10, 0, 0, 2]));
    assert_eq!(
        (k.proto, k.src_port, k.dst_port),
        (ip_proto::TCP, 40000, 80)
    );
    assert!(checksum::ipv4_header_valid(&IPV4_TCP[18..38]));
    assert!(checksum::verify_l4_v4(
        [10, 0, 0, 1],
        [10, 0, 0, 2],
        6,
        &IPV4_TCP[38..]
    ));
}

#[test]
fn golden_ipv4_tcp_is_what_the_builder_emits() {
    let built = FrameBuilder::new()
        .vlan(100)
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2])
        .ident(0x1234)
        .dont_frag(true)
        .tcp(40000, 80)
        .tcp_flags(0x18)
        .seq(1000)
        .ack(2000)
        .payload(b"hello")
        .build();
    assert_eq!(built, IPV4_TCP);
}

#[test]
fn golden_ipv6_ext_headers_are_walked_to_udp() {
    let p = parse_frame(&IPV6_EXT_UDP, &ParseOptions::default()).expect("valid frame");
    let h = p.outer;
    assert_eq!(
        (h.l3, h.l3_offset, h.l3_len, h.ttl),
        (L3::Ipv6, 14, 84, 255)
    );
    // 4 extension headers of 8 bytes each after the 40-byte fixed header.
    assert_eq!((h.l4_offset, h.payload_offset, h.payload_len), (86, 94, 4));
    assert_eq!(h.fragment, Fragment::First);
    let k = h.key.expect("ip has a key");
    assert_eq!((k.src_ip, k.dst_ip), (IpAddr16(v6(1)), IpAddr16(v6(2))));
    assert_eq!((k.proto, k.src_port, k.dst_port), (ip_proto::UDP, 5353, 53));
    assert!(checksum::verify_l4_v6(
        &v6(1),
        &v6(2),
        17,
        &IPV6_EXT_UDP[86..]
    ));
}

#[test]
fn golden_ipv6_ext_headers_are_what_the_builder_emits() {
    let built = FrameBuilder::new()
        .ipv6(v6(1), v6(2))
        .ttl(255)
        .ipv6_ext(Ipv6Ext::HopByHop(vec![]))
        .ipv6_ext(Ipv6Ext::Routing {
            routing_type: 0,
            segments_left: 0,
            data: vec![],
        })
        .ipv6_ext(Ipv6Ext::Fragment {
            offset: 0,
            more: true,
            ident: 0xabcd_ef01,
        })
        .ipv6_ext(Ipv6Ext::DestOpts(vec![]))
        .udp(5353, 53)
        .payload(b"abcd")
        .build();
    assert_eq!(built, IPV6_EXT_UDP);
}

#[test]
fn golden_vxlan_parses_outer_and_inner() {
    let p = parse_frame(&VXLAN_ICMP, &ParseOptions::default()).expect("valid frame");
    let outer = p.outer.key.expect("outer key");
    assert_eq!(
        (outer.proto, outer.src_port, outer.dst_port),
        (17, 49152, 4789)
    );
    assert_eq!(outer.src_ip, IpAddr16::from_v4([10, 0, 0, 1]));
    let v = p.vxlan.expect("vxlan");
    assert_eq!(
        (v.vni.get(), v.offset, v.inner_offset, v.inner_len),
        (0x123456, 42, 50, 46)
    );
    let h = p.inner.expect("inner headers");
    assert_eq!(
        (h.l3, h.l3_offset, h.l3_len, h.l4_offset),
        (L3::Ipv4, 64, 32, 84)
    );
    assert_eq!((h.payload_offset, h.payload_len), (92, 4));
    let k = h.key.expect("inner key");
    assert_eq!(k.src_ip, IpAddr16::from_v4([192, 168, 0, 1]));
    // Echo request: the identifier in the source port, type 8 code 0 in the destination port.
    assert_eq!(
        (k.proto, k.src_port, k.dst_port),
        (ip_proto::ICMP, 7, 0x0800)
    );
    assert_eq!(p.innermost(), &h);
}

#[test]
fn golden_vxlan_outer_header_is_what_write_header_emits() {
    let outer = VxlanOuter::new(
        MacAddr([2, 0, 0, 0, 0, 0xaa]),
        MacAddr([2, 0, 0, 0, 0, 0xbb]),
        "10.0.0.1".parse().expect("literal"),
        "10.0.0.2".parse().expect("literal"),
        49152,
        Vni::new(0x123456).expect("24-bit"),
    );
    let mut hdr = [0u8; 50];
    assert_eq!(outer.write_header(&mut hdr, 46), Ok(50));
    assert_eq!(hdr[..], VXLAN_ICMP[..50]);
    let inner = FrameBuilder::new()
        .ipv4([192, 168, 0, 1], [192, 168, 0, 2])
        .icmp_echo(7, 1, false)
        .payload(b"ping")
        .build();
    assert_eq!(
        spillway_wire::build::vxlan_encap(&inner, &outer),
        VXLAN_ICMP
    );
}

#[test]
fn vxlan_without_i_flag_is_a_bad_field() {
    let mut f = VXLAN_ICMP;
    f[42] = 0;
    let e = parse_frame(&f, &ParseOptions::default()).unwrap_err();
    assert_eq!(
        (e.layer, e.kind, e.inner),
        (Layer::Vxlan, ErrorKind::BadField("I flag"), false)
    );
}

#[test]
fn vxlan_port_is_configurable() {
    let p = parse_frame(&VXLAN_ICMP, &ParseOptions { vxlan_port: 8472 }).expect("plain udp");
    assert!(p.vxlan.is_none() && p.inner.is_none());
    assert_eq!(p.outer.payload_offset, 42);
}

#[test]
fn inner_errors_are_marked_and_displayed_as_inner() {
    let mut f = VXLAN_ICMP;
    f[64] = 0x44; // inner IHL 4
    let e = parse_frame(&f, &ParseOptions::default()).unwrap_err();
    assert_eq!(
        (e.layer, e.kind, e.inner),
        (Layer::Ipv4, ErrorKind::BadField("ihl"), true)
    );
    assert_eq!(
        e.to_string(),
        "inner frame: ipv4: bad ihl: expected 5, got 4"
    );
}

#[test]
fn ethernet_padding_after_ipv4_total_length_is_ignored() {
    let mut f = IPV4_TCP.to_vec();
    f.extend_from_slice(&[0xee; 7]);
    let padded = parse_frame(&f, &ParseOptions::default()).expect("padding is fine");
    let plain = parse_frame(&IPV4_TCP, &ParseOptions::default()).expect("valid");
    assert_eq!(padded, plain);
}

#[test]
fn ipv4_malformed_fields_give_the_documented_kinds() {
    let opts = ParseOptions::default();
    let mut f = IPV4_TCP;
    f[18] = 0x44;
    assert_eq!(
        parse_frame(&f, &opts).unwrap_err().kind,
        ErrorKind::BadField("ihl")
    );
    let mut f = IPV4_TCP;
    f[21] = 19; // total length below the header
    assert_eq!(
        parse_frame(&f, &opts).unwrap_err().kind,
        ErrorKind::LengthMismatch("total length")
    );
    let mut f = IPV4_TCP;
    f[21] = 46; // one byte more than the frame holds
    assert_eq!(
        parse_frame(&f, &opts).unwrap_err().kind,
        ErrorKind::LengthMismatch("total length")
    );
    let mut f = IPV4_TCP;
    f[50] = 0x40; // TCP data offset 4
    let e = parse_frame(&f, &opts).unwrap_err();
    assert_eq!(
        (e.layer, e.kind),
        (Layer::Tcp, ErrorKind::BadField("data offset"))
    );
    let mut f = IPV4_TCP;
    f[50] = 0x70; // data offset 7 = 28 bytes, only 25 left
    let e = parse_frame(&f, &opts).unwrap_err();
    assert_eq!((e.layer, e.kind), (Layer::Tcp, ErrorKind::Truncated));
}

#[test]
fn ipv4_fragments_first_keeps_ports_nonfirst_zeroes_them() {
    let mut f = IPV4_TCP;
    f[24] = 0x20; // MF, offset 0
    f[25] = 0;
    let h = parse_frame(&f, &ParseOptions::default())
        .expect("first fragment")
        .outer;
    assert_eq!(
        (h.fragment, h.key.map(|k| k.dst_port)),
        (Fragment::First, Some(80))
    );
    f[25] = 3; // offset 3 (24 bytes)
    let h = parse_frame(&f, &ParseOptions::default())
        .expect("later fragment")
        .outer;
    assert_eq!(h.fragment, Fragment::NonFirst);
    let k = h.key.expect("key");
    assert_eq!((k.proto, k.src_port, k.dst_port), (6, 0, 0));
    assert_eq!(
        (h.l4_offset, h.payload_offset, h.payload_len, h.tcp_flags),
        (38, 38, 25, 0)
    );
}

#[test]
fn ipv4_first_udp_fragment_keeps_ports_without_checking_the_datagram_length() {
    assert!(checksum::ipv4_header_valid(
        &IPV4_UDP_FIRST_FRAGMENT[14..34]
    ));
    let h = parse_frame(&IPV4_UDP_FIRST_FRAGMENT, &ParseOptions::default())
        .expect("a first fragment is valid although UDP length 1480 > 16 bytes present")
        .outer;
    assert_eq!(h.fragment, Fragment::First);
    let k = h.key.expect("key");
    assert_eq!((k.proto, k.src_port, k.dst_port), (17, 5353, 53));
    // The payload is what this fragment holds, not what the UDP length promises.
    assert_eq!((h.l4_offset, h.payload_offset, h.payload_len), (34, 42, 8));
    assert_eq!(
        h.frag,
        FragmentFields {
            id: 0xbeef,
            offset: 0,
            more: true,
            data_offset: 34
        }
    );
    assert_eq!(h.frag.byte_range(&h), (0, 16));
    // A UDP length below the header's own 8 bytes is still wrong in a first fragment.
    let mut f = IPV4_UDP_FIRST_FRAGMENT;
    f[38..40].copy_from_slice(&7u16.to_be_bytes());
    let e = parse_frame(&f, &ParseOptions::default()).unwrap_err();
    assert_eq!(
        (e.layer, e.kind),
        (Layer::Udp, ErrorKind::LengthMismatch("length"))
    );
    // Cut inside the UDP header (IPv4 total length says so too): the header a first fragment
    // must carry (RFC 8200 section 4.5; RFC 1858 for the tiny-fragment attack) is missing.
    let mut f = IPV4_UDP_FIRST_FRAGMENT;
    f[17] = 20 + 4;
    let e = parse_frame(&f[..38], &ParseOptions::default()).unwrap_err();
    assert_eq!((e.layer, e.kind), (Layer::Udp, ErrorKind::Truncated));
    // The same datagram unfragmented (MF clear) is a UDP length mismatch, as before.
    let mut f = IPV4_UDP_FIRST_FRAGMENT;
    f[20] = 0;
    let e = parse_frame(&f, &ParseOptions::default()).unwrap_err();
    assert_eq!(
        (e.layer, e.kind),
        (Layer::Udp, ErrorKind::LengthMismatch("length"))
    );
}

#[test]
fn ipv4_later_fragment_has_no_transport_header_and_its_byte_range() {
    // Offset 185 units (1480 bytes), MF clear: the last fragment; its 16 bytes are data even
    // though they would not parse as UDP.
    let mut f = IPV4_UDP_FIRST_FRAGMENT;
    f[20..22].copy_from_slice(&185u16.to_be_bytes());
    f[38..40].copy_from_slice(&3u16.to_be_bytes());
    let h = parse_frame(&f, &ParseOptions::default())
        .expect("later fragment")
        .outer;
    assert_eq!(h.fragment, Fragment::NonFirst);
    let k = h.key.expect("key");
    assert_eq!((k.proto, k.src_port, k.dst_port), (17, 0, 0));
    assert_eq!(
        (h.frag.id, h.frag.offset, h.frag.more),
        (0xbeef, 185, false)
    );
    assert_eq!(h.frag.byte_range(&h), (1480, 1496));
}

#[test]
fn ipv6_fragment_header_after_other_extension_headers() {
    // First fragment: the UDP length may exceed what is present.
    let mut f = IPV6_EXT_UDP;
    f[90..92].copy_from_slice(&1000u16.to_be_bytes());
    let h = parse_frame(&f, &ParseOptions::default())
        .expect("first fragment")
        .outer;
    assert_eq!(h.fragment, Fragment::First);
    let k = h.key.expect("key");
    assert_eq!((k.proto, k.src_port, k.dst_port), (17, 5353, 53));
    assert_eq!(h.payload_len, 4);
    // The fragment header is the third, after hop-by-hop and routing: 14 + 40 + 8 + 8 + 8.
    assert_eq!(
        h.frag,
        FragmentFields {
            id: 0xabcd_ef01,
            offset: 0,
            more: true,
            data_offset: 78
        }
    );
    // The fragmentable part starts with the destination options header (RFC 8200 4.5).
    assert_eq!(h.frag.byte_range(&h), (0, 20));
    // Later fragment, offset 2 units: the walk stops at the fragment header, whose Next Header
    // (60, destination options) is the key's protocol; no ports.
    let mut f = IPV6_EXT_UDP;
    f[72..74].copy_from_slice(&((2u16 << 3) | 1).to_be_bytes());
    let h = parse_frame(&f, &ParseOptions::default())
        .expect("later fragment")
        .outer;
    assert_eq!(h.fragment, Fragment::NonFirst);
    let k = h.key.expect("key");
    assert_eq!((k.proto, k.src_port, k.dst_port), (60, 0, 0));
    assert_eq!((h.l4_offset, h.payload_len), (78, 20));
    assert_eq!(
        (h.frag.id, h.frag.offset, h.frag.more, h.frag.byte_range(&h)),
        (0xabcd_ef01, 2, true, (16, 36))
    );
    // Truncated inside the fragment header: a length error at the extension layer.
    let mut f = IPV6_EXT_UDP;
    f[19] = 16 + 4;
    let e = parse_frame(&f[..74], &ParseOptions::default()).unwrap_err();
    assert_eq!((e.layer, e.kind), (Layer::Ipv6Ext, ErrorKind::Truncated));
}

#[test]
fn udp_length_errors_are_length_mismatches() {
    let udp = FrameBuilder::new()
        .ipv4([1, 1, 1, 1], [2, 2, 2, 2])
        .udp(1, 2)
        .payload(b"xyz")
        .build();
    let opts = ParseOptions::default();
    for bad in [7u8, 12] {
        let mut f = udp.clone();
        f[39] = bad; // UDP length low byte (11 is right)
        let e = parse_frame(&f, &opts).unwrap_err();
        assert_eq!(
            (e.layer, e.kind),
            (Layer::Udp, ErrorKind::LengthMismatch("length"))
        );
    }
}

#[test]
fn three_vlan_tags_are_too_deep_and_9100_is_a_tag() {
    let f = FrameBuilder::new()
        .vlan_tpid(0x9100, 1)
        .vlan(2)
        .ipv4([1, 1, 1, 1], [2, 2, 2, 2])
        .udp(1, 2)
        .build();
    let h = parse_frame(&f, &ParseOptions::default())
        .expect("qinq")
        .outer;
    assert_eq!((h.vlan_count, h.vlans), (2, [1, 2]));
    let f = FrameBuilder::new()
        .vlan(1)
        .vlan(2)
        .vlan(3)
        .ipv4([1; 4], [2; 4])
        .build();
    let e = parse_frame(&f, &ParseOptions::default()).unwrap_err();
    assert_eq!(
        (e.layer, e.kind),
        (Layer::Vlan, ErrorKind::TooDeep("vlan tags"))
    );
}

#[test]
fn ipv6_limits_and_opaque_protocols() {
    let opts = ParseOptions::default();
    let mut b = FrameBuilder::new().ipv6(v6(1), v6(2));
    for _ in 0..9 {
        b = b.ipv6_ext(Ipv6Ext::DestOpts(vec![]));
    }
    let e = parse_frame(&b.clone().tcp(1, 2).build(), &opts).unwrap_err();
    assert_eq!(
        (e.layer, e.kind),
        (Layer::Ipv6Ext, ErrorKind::TooDeep("extension headers"))
    );
    // Hop-by-hop anywhere but first is malformed (RFC 8200 section 4.1).
    let f = FrameBuilder::new()
        .ipv6(v6(1), v6(2))
        .ipv6_ext(Ipv6Ext::DestOpts(vec![]))
        .ipv6_ext(Ipv6Ext::HopByHop(vec![]))
        .udp(1, 2)
        .build();
    assert_eq!(
        parse_frame(&f, &opts).unwrap_err().kind,
        ErrorKind::BadField("hop-by-hop position")
    );
    // AH ends the walk with protocol 51 and zero ports.
    let f = FrameBuilder::new()
        .ipv6(v6(1), v6(2))
        .ipv6_ext(Ipv6Ext::Ah)
        .tcp(1, 2)
        .build();
    let h = parse_frame(&f, &opts).expect("ah").outer;
    let k = h.key.expect("key");
    assert_eq!(
        (k.proto, k.src_port, k.dst_port, h.l4_offset),
        (51, 0, 0, 54)
    );
    // No Next Header.
    let f = FrameBuilder::new()
        .ipv6(v6(1), v6(2))
        .raw(59)
        .payload(&[1, 2])
        .build();
    let k = parse_frame(&f, &opts)
        .expect("no next")
        .outer
        .key
        .expect("key");
    assert_eq!((k.proto, k.src_port), (59, 0));
    // Payload length beyond the frame.
    let mut f = FrameBuilder::new().ipv6(v6(1), v6(2)).udp(1, 2).build();
    f[19] += 1;
    assert_eq!(
        parse_frame(&f, &opts).unwrap_err().kind,
        ErrorKind::LengthMismatch("payload length")
    );
}

#[test]
fn arp_is_recognised_and_validated() {
    let f = FrameBuilder::new()
        .eth(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr::BROADCAST)
        .arp(1, [10, 0, 0, 1], MacAddr::ZERO, [10, 0, 0, 2])
        .payload(&[0; 18]) // Ethernet minimum-size padding
        .build();
    let h = parse_frame(&f, &ParseOptions::default())
        .expect("arp")
        .outer;
    assert_eq!(
        (h.l3, h.l3_len, h.key, h.l4_offset),
        (L3::Arp, 28, None, 42)
    );
    let mut bad = f.clone();
    bad[19] = 16; // protocol length
    let e = parse_frame(&bad, &ParseOptions::default()).unwrap_err();
    assert_eq!(
        (e.layer, e.kind),
        (Layer::Arp, ErrorKind::BadField("protocol length"))
    );
}

#[test]
fn icmpv6_echo_and_other_types_follow_the_flow_key_convention() {
    let f = FrameBuilder::new()
        .ipv6(v6(1), v6(2))
        .icmp_echo(99, 1, true)
        .build();
    let k = parse_frame(&f, &ParseOptions::default())
        .expect("echo")
        .outer
        .key
        .expect("key");
    assert_eq!((k.proto, k.src_port, k.dst_port), (58, 99, 0x8100));
    let f = FrameBuilder::new().ipv6(v6(1), v6(2)).icmp(1, 4).build();
    let k = parse_frame(&f, &ParseOptions::default())
        .expect("unreach")
        .outer
        .key
        .expect("key");
    assert_eq!((k.src_port, k.dst_port), (0, 0x0104));
    assert!(checksum::verify_l4_v6(&v6(1), &v6(2), 58, &f[54..]));
}

/// Neighbor Advertisement fd00:1::1 -> fd00:1::10, flags router | solicited | override, target
/// fd00:1::1, target link-layer address option 02:00:00:00:01:01 (RFC 4861 sections 4.4 and
/// 4.6.1); the checksum 0x9b8a was computed by the separate script.
const NA_ROUTER: [u8; 32] = [
    0x88, 0x00, 0x9b, 0x8a, 0xe0, 0x00, 0x00, 0x00, 0xfd, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x01, 0x02, 0x00, 0x00, 0x00, 0x01, 0x01,
];

#[test]
fn neighbor_advertisement_golden_bytes() {
    use spillway_wire::nd::{self, NeighborOp, NeighborRepr};
    let src: core::net::Ipv6Addr = "fd00:1::1".parse().unwrap();
    let dst: core::net::Ipv6Addr = "fd00:1::10".parse().unwrap();
    let repr = NeighborRepr::parse(&NA_ROUTER).expect("valid NA");
    assert_eq!(
        repr,
        NeighborRepr {
            op: NeighborOp::Advert,
            flags: nd::FLAG_ROUTER | nd::FLAG_SOLICITED | nd::FLAG_OVERRIDE,
            target: src.octets(),
            lla: Some(MacAddr([2, 0, 0, 0, 1, 1])),
        }
    );
    assert!(checksum::verify_l4_v6(
        &src.octets(),
        &dst.octets(),
        ip_proto::ICMPV6,
        &NA_ROUTER
    ));
    let mut out = [0u8; 40];
    assert_eq!(repr.emit(&src.octets(), &dst.octets(), &mut out), Ok(32));
    assert_eq!(out[..32], NA_ROUTER);
    // Too small a buffer is a length error, not a panic.
    assert_eq!(
        repr.emit(&src.octets(), &dst.octets(), &mut out[..31])
            .unwrap_err()
            .kind,
        ErrorKind::Truncated
    );
    // RFC 4861 section 7.1.2: a non-zero code or a multicast target makes it invalid.
    let mut bad = NA_ROUTER;
    bad[1] = 1;
    assert_eq!(
        NeighborRepr::parse(&bad).unwrap_err().kind,
        ErrorKind::BadField("code")
    );
    let mut bad = NA_ROUTER;
    bad[8] = 0xff;
    assert_eq!(
        NeighborRepr::parse(&bad).unwrap_err().kind,
        ErrorKind::BadField("target")
    );
}
