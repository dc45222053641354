//! `parse_frame` is on the fast path and must not allocate (STYLE.md section 6). A counting
//! global allocator wraps the system allocator; frames are built first (the builder allocates),
//! then the allocation count is read before and after parsing every frame many times, including
//! error cases, and must not change. This file holds a single test so no other test thread can
//! allocate while the count is being compared.

use spillway_wire::build::{FrameBuilder, Ipv6Ext, VxlanOuter, vxlan_encap};
use spillway_wire::{MacAddr, ParseOptions, Vni, parse_frame};

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

#[test]
fn parse_frame_never_allocates() {
    let inner = FrameBuilder::new()
        .vlan(7)
        .ipv4([10, 0, 0, 1], [10, 0, 0, 2])
        .tcp(1, 2)
        .payload(&[1; 30])
        .build();
    let outer = VxlanOuter::new(
        MacAddr([2; 6]),
        MacAddr([4; 6]),
        "fd00::1".parse().expect("literal"),
        "fd00::2".parse().expect("literal"),
        5,
        Vni::new(9).expect("24-bit"),
    );
    let v6 = FrameBuilder::new()
        .ipv6([1; 16], [2; 16])
        .ipv6_ext(Ipv6Ext::HopByHop(vec![]))
        .ipv6_ext(Ipv6Ext::Fragment {
            offset: 0,
            more: true,
            ident: 1,
        })
        .udp(3, 4)
        .build();
    let frames = [
        vxlan_encap(&inner, &outer),
        inner.clone(),
        v6,
        inner[..40].to_vec(),
        vec![],
    ];
    let opts = ParseOptions::default();
    let before = spillway_testkit::allocations();
    let mut ok = 0;
    for _ in 0..1000 {
        for f in &frames {
            ok += parse_frame(std::hint::black_box(f), &opts).is_ok() as usize;
        }
    }
    let after = spillway_testkit::allocations();
    assert_eq!(ok, 3000);
    assert_eq!(after - before, 0, "parse_frame allocated");
}
