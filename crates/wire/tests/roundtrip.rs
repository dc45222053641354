//! Property tests of the parser against the builder. A generated `FrameSpec` (VLANs, IPv4 with
//! options and fragment fields or IPv6 with extension headers, TCP/UDP/ICMP echo/raw, payload)
//! is built with `FrameBuilder`, optionally wrapped in VXLAN, and parsed: every `Headers` field
//! must equal the spec's prediction and the checksums must verify (round trip). Truncating a
//! valid IP frame at every shorter length must give `Truncated` or `LengthMismatch` (an IP frame
//! built here has no padding, so every prefix cuts the datagram its length field promises),
//! whereas non-IP frames legitimately parse shorter: this is checked exactly. Arbitrary and
//! mutated bytes must never panic, and the fuzz regression files are replayed.

mod common;

use common::{FrameSpec, frame_spec};
use proptest::prelude::*;
use spillway_wire::build::{FrameBuilder, VxlanOuter, vxlan_encap};
use spillway_wire::{
    ErrorKind, Fragment, L3, MacAddr, ParseOptions, Vni, checksum, ip_proto, parse_frame,
};

fn opts() -> ParseOptions {
    ParseOptions::default()
}

fn check_checksums(spec: &FrameSpec, f: &[u8]) {
    let h = spec.expected();
    let l3 = h.l3_offset as usize;
    let l4 = h.l4_offset as usize;
    let end = l3 + h.l3_len as usize;
    let k = h.key.expect("ip");
    if h.fragment == Fragment::NonFirst {
        return;
    }
    match h.l3 {
        L3::Ipv4 => {
            assert!(checksum::ipv4_header_valid(&f[l3..l4]));
            let (s, d) = (
                k.src_ip.v4_octets().expect("v4"),
                k.dst_ip.v4_octets().expect("v4"),
            );
            match k.proto {
                ip_proto::TCP | ip_proto::UDP => {
                    assert!(checksum::verify_l4_v4(s, d, k.proto, &f[l4..end]))
                }
                ip_proto::ICMP => assert_eq!(checksum::fold(checksum::sum(&f[l4..end], 0)), 0xffff),
                _ => {}
            }
        }
        _ => {
            if matches!(k.proto, ip_proto::TCP | ip_proto::UDP | ip_proto::ICMPV6) {
                assert!(checksum::verify_l4_v6(
                    &k.src_ip.0,
                    &k.dst_ip.0,
                    k.proto,
                    &f[l4..end]
                ));
            }
        }
    }
}

fn outer_spec() -> impl Strategy<Value = VxlanOuter> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 4]>(),
        any::<[u8; 16]>(),
        any::<bool>(),
        any::<u16>(),
        0u32..=Vni::MAX,
    )
        .prop_map(|(s4, d4, s6, v6, sport, vni)| {
            let (src, dst) = if v6 {
                (
                    std::net::Ipv6Addr::from(s6).into(),
                    std::net::Ipv6Addr::from(!u128::from_be_bytes(s6)).into(),
                )
            } else {
                (
                    std::net::Ipv4Addr::from(s4).into(),
                    std::net::Ipv4Addr::from(d4).into(),
                )
            };
            VxlanOuter::new(
                MacAddr([2, 0, 0, 0, 0, 1]),
                MacAddr([2, 0, 0, 0, 0, 2]),
                src,
                dst,
                sport,
                Vni::new(vni).expect("in range"),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn build_then_parse_reports_every_field(spec in frame_spec()) {
        let f = spec.build();
        let p = parse_frame(&f, &opts()).expect("built frames are valid");
        prop_assert_eq!(p.vxlan, None);
        prop_assert_eq!(p.outer, spec.expected());
        let h = p.outer;
        if h.fragment != Fragment::NonFirst {
            let s = h.payload_offset as usize;
            prop_assert_eq!(&f[s..s + h.payload_len as usize], &spec.payload[..]);
        }
        check_checksums(&spec, &f);
    }

    #[test]
    fn vxlan_encap_then_parse_reports_outer_and_inner(spec in frame_spec(), outer in outer_spec()) {
        let inner = spec.build();
        let f = vxlan_encap(&inner, &outer);
        let p = parse_frame(&f, &opts()).expect("encapsulated frames are valid");
        let v = p.vxlan.expect("vxlan");
        prop_assert_eq!(v.vni, outer.vni);
        prop_assert_eq!(v.inner_offset as usize, outer.header_len());
        prop_assert_eq!(v.inner_len as usize, inner.len());
        let k = p.outer.key.expect("outer key");
        prop_assert_eq!((k.proto, k.src_port, k.dst_port), (17, outer.src_port, 4789));
        prop_assert_eq!(k.src_ip, outer.src_ip.into());
        // Shift the expected inner offsets by the outer header length.
        let mut want = spec.expected();
        let d = outer.header_len() as u16;
        want.l3_offset += d;
        want.l4_offset += d;
        want.payload_offset += d;
        if want.frag.data_offset != 0 {
            want.frag.data_offset += d;
        }
        prop_assert_eq!(p.inner, Some(want));
        // Outer checksums: IPv4 header valid and UDP 0; IPv6 UDP checksum valid.
        if outer.is_ipv6() {
            prop_assert!(checksum::verify_l4_v6(&k.src_ip.0, &k.dst_ip.0, 17, &f[54..]));
        } else {
            prop_assert!(checksum::ipv4_header_valid(&f[14..34]));
            prop_assert_eq!(&f[40..42], &[0, 0]);
        }
    }

    #[test]
    fn truncating_an_ip_frame_always_gives_a_length_error(spec in frame_spec()) {
        let f = spec.build();
        for len in 0..f.len() {
            let e = parse_frame(&f[..len], &opts()).expect_err("every prefix cuts the datagram");
            prop_assert!(e.is_length_error(), "len {}: {}", len, e);
        }
    }

    #[test]
    fn a_first_udp_fragment_keeps_its_ports_whatever_the_datagram_length(
        spec in frame_spec().prop_filter("first UDP fragment", |s| {
            s.fragment() == Fragment::First && matches!(s.l4, common::L4::Udp { .. })
        }),
        udp_len in 8u16..,
    ) {
        // RFC 768's length covers the whole datagram; a first fragment holds only its start,
        // so any length of at least the header is consistent with it.
        let mut f = spec.build();
        let want = spec.expected();
        let l4 = want.l4_offset as usize;
        f[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
        let h = parse_frame(&f, &opts()).expect("first fragments parse").outer;
        prop_assert_eq!(h.key, want.key);
        prop_assert_eq!(h.frag, want.frag);
        prop_assert_eq!(usize::from(h.payload_offset) + usize::from(h.payload_len), f.len());
    }

    #[test]
    fn truncating_a_vxlan_inner_frame_gives_an_inner_length_error(spec in frame_spec(), outer in outer_spec()) {
        // The outer lengths are consistent with the cut inner frame, so the error must come
        // from inside it and be marked `inner`.
        let inner = spec.build();
        for len in 0..inner.len() {
            let f = vxlan_encap(&inner[..len], &outer);
            let e = parse_frame(&f, &opts()).expect_err("inner prefix is cut");
            prop_assert!(e.is_length_error() && e.inner, "len {}: {}", len, e);
        }
    }

    #[test]
    fn ethernet_padding_never_changes_the_parse(spec in frame_spec(), pad in prop::collection::vec(any::<u8>(), 1..40)) {
        let mut f = spec.build();
        f.extend_from_slice(&pad);
        prop_assert_eq!(parse_frame(&f, &opts()).expect("padding is allowed").outer, spec.expected());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), port in any::<u16>()) {
        let _ = parse_frame(&bytes, &ParseOptions { vxlan_port: port });
    }

    #[test]
    fn mutated_valid_frames_never_panic(spec in frame_spec(), outer in outer_spec(), muts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut f = vxlan_encap(&spec.build(), &outer);
        for (i, b) in muts {
            let at = i.index(f.len());
            f[at] = b;
        }
        if let Ok(p) = parse_frame(&f, &opts()) {
            let h = p.innermost();
            prop_assert!(h.payload_offset as usize + h.payload_len as usize <= f.len());
        }
    }

    #[test]
    fn non_ip_frames_truncate_exactly_where_the_format_says(
        vlans in common::vlans(), payload in prop::collection::vec(any::<u8>(), 0..40), arp in any::<bool>()
    ) {
        let mut b = FrameBuilder::new();
        for (tpid, tci) in &vlans {
            b = b.vlan_tpid(*tpid, *tci);
        }
        let b = if arp { b.arp(2, [1, 2, 3, 4], MacAddr([9; 6]), [5, 6, 7, 8]) } else { b.ethertype(0x88b5) };
        let f = b.payload(&payload).build();
        // ARP needs its 28 bytes, other EtherTypes only the Ethernet header and tags; bytes after
        // that are payload or padding and may be cut.
        let min = 14 + 4 * vlans.len() + if arp { 28 } else { 0 };
        for len in 0..=f.len() {
            match parse_frame(&f[..len], &opts()) {
                Ok(_) => prop_assert!(len >= min, "len {} parsed", len),
                Err(e) => prop_assert!(len < min && e.kind == ErrorKind::Truncated, "len {}: {}", len, e),
            }
        }
    }
}

#[test]
fn fuzz_regressions_replay_without_panicking() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("regression dir exists") {
        let path = entry.expect("dir entry").path();
        let bytes = std::fs::read(&path).expect("readable");
        for port in [4789, 0] {
            if let Ok(p) = parse_frame(&bytes, &ParseOptions { vxlan_port: port }) {
                let h = p.innermost();
                assert!(h.payload_offset as usize + h.payload_len as usize <= bytes.len());
            }
        }
        n += 1;
    }
    assert!(n >= 3, "seed inputs are present");
}

proptest! {
    /// NS and NA (RFC 4861 sections 4.3, 4.4): emit then parse gives back the message, the
    /// checksum verifies, and every truncation is an error, never a panic.
    #[test]
    fn neighbor_messages_round_trip(
        advert in any::<bool>(), flags in any::<u32>(), mut target in any::<[u8; 16]>(),
        lla in proptest::option::of(any::<[u8; 6]>()), src in any::<[u8; 16]>(), dst in any::<[u8; 16]>(),
    ) {
        use spillway_wire::nd::{NeighborOp, NeighborRepr};
        if target[0] == 0xff {
            target[0] = 0xfe; // a multicast target is invalid (RFC 4861 section 7.1)
        }
        let repr = NeighborRepr {
            op: if advert { NeighborOp::Advert } else { NeighborOp::Solicit },
            flags: if advert { flags & 0xe000_0000 } else { 0 },
            target,
            lla: lla.map(MacAddr),
        };
        let mut buf = [0u8; 32];
        let n = repr.emit(&src, &dst, &mut buf).expect("fits");
        prop_assert_eq!(n, repr.buffer_len());
        prop_assert_eq!(NeighborRepr::parse(&buf[..n]), Ok(repr));
        prop_assert!(checksum::verify_l4_v6(&src, &dst, ip_proto::ICMPV6, &buf[..n]));
        for len in 0..n {
            let ok = NeighborRepr::parse(&buf[..len]).is_ok();
            // Cutting exactly the option off leaves a valid option-less message.
            prop_assert_eq!(ok, len == 24, "len {}", len);
        }
    }

    /// Arbitrary bytes never panic the NS/NA parser.
    #[test]
    fn neighbor_parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
        let _ = spillway_wire::nd::NeighborRepr::parse(&bytes);
    }
}
