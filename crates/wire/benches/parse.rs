//! Measures `parse_frame`, the first step of every packet on the fast path, on three fixed
//! frames: a 64-byte VXLAN-encapsulated IPv4/UDP packet (outer + inner parse; budget 25 ns), a
//! plain IPv4/TCP frame, and an IPv6/TCP frame behind three extension headers (the walk's cost).
//! The frames are built once, outside the timed loop; `black_box` keeps the compiler from
//! hoisting the parse out of it. A regression here is a regression in packets per core.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use spillway_wire::build::{FrameBuilder, Ipv6Ext, VxlanOuter, vxlan_encap};
use spillway_wire::{MacAddr, ParseOptions, Vni, parse_frame};

fn frames() -> Vec<(&'static str, Vec<u8>)> {
    // "64B" is the inner frame: a minimum-size Ethernet frame (42 bytes of Ethernet/IPv4/UDP
    // headers + 22 bytes of payload, FCS excluded) inside 50 bytes of outer headers, so the
    // parsed buffer is 114 bytes. No VXLAN packet can itself be 64 bytes: the outer headers and
    // a minimal inner header stack alone are 92.
    let inner = FrameBuilder::new()
        .ipv4([192, 168, 1, 10], [192, 168, 1, 20])
        .udp(40000, 53)
        .payload(&[0u8; 22])
        .build();
    assert_eq!(inner.len(), 64);
    let outer = VxlanOuter::new(
        MacAddr([2, 0, 0, 0, 0, 1]),
        MacAddr([2, 0, 0, 0, 0, 2]),
        "10.0.0.1".parse().expect("literal"),
        "10.0.0.2".parse().expect("literal"),
        50000,
        Vni::new(1000).expect("24-bit"),
    );
    let vxlan = vxlan_encap(&inner, &outer);
    let v4_tcp = FrameBuilder::new()
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2])
        .tcp(40000, 443)
        .payload(&[0u8; 64])
        .build();
    let v6_ext_tcp = FrameBuilder::new()
        .ipv6(
            "2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .expect("literal"),
            "2001:db8::2"
                .parse::<std::net::Ipv6Addr>()
                .expect("literal"),
        )
        .ipv6_ext(Ipv6Ext::HopByHop(vec![]))
        .ipv6_ext(Ipv6Ext::Routing {
            routing_type: 4,
            segments_left: 0,
            data: vec![0; 20],
        })
        .ipv6_ext(Ipv6Ext::DestOpts(vec![]))
        .tcp(40000, 443)
        .payload(&[0u8; 64])
        .build();
    vec![
        ("vxlan_ipv4_udp_64B", vxlan),
        ("ipv4_tcp", v4_tcp),
        ("ipv6_ext_tcp", v6_ext_tcp),
    ]
}

fn bench_parse(c: &mut Criterion) {
    let opts = ParseOptions::default();
    let mut g = c.benchmark_group("wire/parse");
    for (name, frame) in frames() {
        parse_frame(&frame, &opts).expect("bench frames are valid");
        g.bench_function(name, |b| {
            b.iter(|| parse_frame(black_box(&frame), black_box(&opts)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
