//! `parse_frame_decap` decapsulates exactly what its `Decap` names: nothing with `Off` (a UDP
//! datagram to 4789 is plain UDP, its payload never read, so a payload that is not VXLAN is no
//! error), and with `Vxlan` only datagrams to the port *and* the VTEP address. Everything else
//! it parses as `parse_frame` does, which the last test checks on the same frames.

use spillway_wire::build::{FrameBuilder, VxlanOuter, vxlan_encap};
use spillway_wire::{
    Decap, ErrorKind, IpAddr16, Layer, MacAddr, ParseOptions, Vni, parse_frame, parse_frame_decap,
};
use std::net::{IpAddr, Ipv4Addr};

const VTEP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

fn inner() -> Vec<u8> {
    FrameBuilder::new()
        .eth(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]))
        .ipv4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))
        .udp(1000, 53)
        .payload(b"q")
        .build()
}

fn vxlan_to(dst: Ipv4Addr) -> Vec<u8> {
    let outer = VxlanOuter::new(
        MacAddr([2, 0, 0, 0, 0, 0xfe]),
        MacAddr([2, 0, 0, 0, 0, 1]),
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
        IpAddr::V4(dst),
        50000,
        Vni::new(7).expect("24-bit"),
    );
    vxlan_encap(&inner(), &outer)
}

fn uplink() -> Decap {
    Decap::Vxlan {
        port: 4789,
        vtep: IpAddr16::from(VTEP),
    }
}

#[test]
fn off_parses_udp_to_4789_as_plain_udp_even_without_a_vxlan_header() {
    let mut bad = vxlan_to(VTEP);
    bad[14 + 20 + 8] = 0; // the I flag
    let e = parse_frame(&bad, &ParseOptions::default()).expect_err("VXLAN without the I flag");
    assert_eq!(
        (e.layer, e.kind),
        (Layer::Vxlan, ErrorKind::BadField("I flag"))
    );
    for frame in [vxlan_to(VTEP), bad] {
        let p = parse_frame_decap(&frame, Decap::Off).expect("plain UDP");
        assert!(p.vxlan.is_none() && p.inner.is_none());
        assert_eq!(p.outer.key.expect("IP").dst_port, 4789);
    }
}

#[test]
fn vxlan_decapsulates_only_datagrams_addressed_to_the_vtep() {
    let ours = parse_frame_decap(&vxlan_to(VTEP), uplink()).expect("VXLAN");
    assert_eq!(ours.vxlan.expect("decapsulated").vni.get(), 7);
    assert_eq!(ours.inner.expect("inner").key.expect("IP").dst_port, 53);
    let other = Ipv4Addr::new(192, 0, 2, 99);
    let theirs = parse_frame_decap(&vxlan_to(other), uplink()).expect("plain UDP");
    assert!(theirs.vxlan.is_none() && theirs.inner.is_none());
    // A bad header to the VTEP is still an error there: it claims to be our underlay.
    let mut bad = vxlan_to(VTEP);
    bad[14 + 20 + 8] = 0;
    let e = parse_frame_decap(&bad, uplink()).expect_err("bad I flag");
    assert_eq!(e.layer, Layer::Vxlan);
    assert_eq!(e.kind, ErrorKind::BadField("I flag"));
}

#[test]
fn vxlan_to_the_vtep_parses_exactly_as_parse_frame() {
    for frame in [vxlan_to(VTEP), inner()] {
        assert_eq!(
            parse_frame_decap(&frame, uplink()),
            parse_frame(&frame, &ParseOptions::default())
        );
    }
}
