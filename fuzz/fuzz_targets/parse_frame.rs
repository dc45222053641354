//! Parses arbitrary bytes with `parse_frame` (default VXLAN port, and port 0 derived from the
//! first byte so other ports get exercised too) and, on success, checks the documented offset
//! invariants: every offset within the buffer, payloads within their datagram, and VXLAN inner
//! headers inside the outer UDP payload. Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway_wire::{Headers, L3, ParseOptions, parse_frame};

fn check(h: &Headers, len: usize, lo: usize, hi: usize) {
    let l3_end = h.l3_offset as usize + h.l3_len as usize;
    assert!(lo <= h.l3_offset as usize && l3_end <= hi && hi <= len);
    assert!(h.l4_offset as usize <= h.payload_offset as usize || h.l3 == L3::Other);
    if matches!(h.l3, L3::Ipv4 | L3::Ipv6) {
        assert!(h.key.is_some());
        assert!(h.l3_offset <= h.l4_offset);
        assert!(h.payload_offset as usize + h.payload_len as usize <= l3_end);
    } else {
        assert!(h.key.is_none());
        assert!(h.payload_offset as usize <= len);
    }
    assert!(h.vlan_count <= 2);
}

fuzz_target!(|data: &[u8]| {
    let port = if data.first().is_some_and(|b| b & 1 == 1) {
        4789
    } else {
        0
    };
    for opts in [ParseOptions::default(), ParseOptions { vxlan_port: port }] {
        if let Ok(p) = parse_frame(data, &opts) {
            check(&p.outer, data.len(), 0, data.len());
            assert_eq!(p.vxlan.is_some(), p.inner.is_some());
            if let (Some(v), Some(inner)) = (p.vxlan, p.inner) {
                let end = v.inner_offset as usize + v.inner_len as usize;
                assert_eq!(v.offset, p.outer.payload_offset);
                assert_eq!(v.inner_offset, v.offset + 8);
                check(&inner, data.len(), v.inner_offset as usize, end);
            }
        }
    }
});
