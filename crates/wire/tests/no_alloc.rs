//! `parse_frame` is on the fast path and must not allocate (STYLE.md section 6). A counting
//! global allocator wraps the system allocator; frames are built first (the builder allocates),
//! then the allocation count is read before and after parsing every frame many times, including
//! error cases, and must not change. This file holds a single test so no other test thread can
//! allocate while the count is being compared.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use spillway_wire::build::{FrameBuilder, Ipv6Ext, VxlanOuter, vxlan_encap};
use spillway_wire::{MacAddr, ParseOptions, Vni, parse_frame};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to `System` unchanged; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    let before = ALLOCS.load(Ordering::SeqCst);
    let mut ok = 0;
    for _ in 0..1000 {
        for f in &frames {
            ok += parse_frame(std::hint::black_box(f), &opts).is_ok() as usize;
        }
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    assert_eq!(ok, 3000);
    assert_eq!(after - before, 0, "parse_frame allocated");
}
