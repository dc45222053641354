//! RFC 1624 incremental checksum updates must equal a full recompute. A generated frame is
//! built, then NAT-style rewrites (source/destination address, ports, IPv4 TTL, TCP sequence
//! number) are applied in place while the IPv4 header and TCP/UDP checksums are patched with
//! `update16`/`update32`/`update_bytes` (and the UDP-over-IPv4 variants that keep a "no
//! checksum" 0). The result must be byte-identical to building the rewritten frame from scratch
//! with `FrameBuilder`, which recomputes every checksum in full.

mod common;

use common::{FrameSpec, L4, Net, frame_spec};
use proptest::prelude::*;
use spillway_wire::checksum::{self, update_bytes, update16, update32};
use spillway_wire::{Fragment, ParseOptions, parse_frame};

#[derive(Debug, Clone)]
struct Rewrite {
    src4: [u8; 4],
    dst6: [u8; 16],
    sport: u16,
    dport: u16,
    ttl: u8,
    seq: u32,
}

fn rewrite() -> impl Strategy<Value = Rewrite> {
    (
        any::<[u8; 4]>(),
        any::<[u8; 16]>(),
        any::<u16>(),
        any::<u16>(),
        any::<u8>(),
        any::<u32>(),
    )
        .prop_map(|(src4, dst6, sport, dport, ttl, seq)| Rewrite {
            src4,
            dst6,
            sport,
            dport,
            ttl,
            seq,
        })
        .prop_map(|mut r| {
            for p in [&mut r.sport, &mut r.dport] {
                if *p == 4789 {
                    *p = 4790;
                }
            }
            r
        })
}

fn get16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn put16(f: &mut [u8], at: usize, v: u16) {
    f[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Applies `r` to `f` in place with incremental checksum updates only.
fn rewrite_incrementally(spec: &FrameSpec, f: &mut [u8], r: &Rewrite) {
    let h = parse_frame(f, &ParseOptions::default())
        .expect("valid")
        .outer;
    let l3 = h.l3_offset as usize;
    let l4 = h.l4_offset as usize;
    let v4 = matches!(spec.net, Net::V4 { .. });
    let (csum_at, udp) = match spec.l4 {
        L4::Tcp { .. } => (Some(l4 + 16), false),
        L4::Udp { .. } => (Some(l4 + 6), true),
        // ICMPv6 covers the pseudo header (RFC 4443 section 2.3); ICMPv4 does not.
        L4::Echo { .. } if !v4 => (Some(l4 + 2), false),
        _ => (None, false),
    };
    let has_ports = matches!(spec.l4, L4::Tcp { .. } | L4::Udp { .. });
    let mut l4c = csum_at.map(|at| get16(f, at));
    let upd_bytes = |c: u16, old: &[u8], new: &[u8]| {
        if udp && v4 {
            checksum::update_udp_v4_bytes(c, old, new)
        } else {
            udp_fix(udp, update_bytes(c, old, new))
        }
    };
    let upd16 = |c: u16, old: u16, new: u16| {
        if udp && v4 {
            checksum::update_udp_v4_16(c, old, new)
        } else {
            udp_fix(udp, update16(c, old, new))
        }
    };
    if v4 {
        // Source address: in the IP header checksum and the pseudo header.
        let old: [u8; 4] = f[l3 + 12..l3 + 16].try_into().expect("4 bytes");
        let ipc = update_bytes(get16(f, l3 + 10), &old, &r.src4);
        f[l3 + 12..l3 + 16].copy_from_slice(&r.src4);
        // TTL shares a 16-bit word with the protocol.
        let old_word = get16(f, l3 + 8);
        f[l3 + 8] = r.ttl;
        let ipc = update16(ipc, old_word, get16(f, l3 + 8));
        put16(f, l3 + 10, ipc);
        l4c = l4c.map(|c| upd_bytes(c, &old, &r.src4));
    } else {
        let old: [u8; 16] = f[l3 + 24..l3 + 40].try_into().expect("16 bytes");
        f[l3 + 24..l3 + 40].copy_from_slice(&r.dst6);
        l4c = l4c.map(|c| upd_bytes(c, &old, &r.dst6));
    }
    if has_ports {
        let (os, od) = (get16(f, l4), get16(f, l4 + 2));
        put16(f, l4, r.sport);
        put16(f, l4 + 2, r.dport);
        l4c = l4c.map(|c| upd16(upd16(c, os, r.sport), od, r.dport));
    }
    if let L4::Tcp { .. } = spec.l4 {
        let old = u32::from_be_bytes(f[l4 + 4..l4 + 8].try_into().expect("4 bytes"));
        f[l4 + 4..l4 + 8].copy_from_slice(&r.seq.to_be_bytes());
        l4c = l4c.map(|c| update32(c, old, r.seq));
    }
    if let (Some(at), Some(c)) = (csum_at, l4c) {
        put16(f, at, c);
    }
}

/// Over IPv6 a UDP checksum of 0 must be sent as 0xffff, like a fully computed one.
fn udp_fix(udp: bool, c: u16) -> u16 {
    if udp { checksum::udp_v4_wire(c) } else { c }
}

/// The same rewrite expressed in the spec, so the builder recomputes everything.
fn rewrite_spec(spec: &FrameSpec, r: &Rewrite) -> FrameSpec {
    let mut s = spec.clone();
    match &mut s.net {
        Net::V4 { src, ttl, .. } => {
            *src = r.src4;
            *ttl = r.ttl;
        }
        Net::V6 { dst, .. } => *dst = r.dst6,
    }
    match &mut s.l4 {
        L4::Tcp { src, dst, seq, .. } => {
            *src = r.sport;
            *dst = r.dport;
            *seq = r.seq;
        }
        L4::Udp { src, dst } => {
            *src = r.sport;
            *dst = r.dport;
        }
        _ => {}
    }
    s
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn incremental_update_equals_full_recompute(spec in frame_spec(), r in rewrite()) {
        // Non-first fragments carry no transport header to rewrite.
        prop_assume!(spec.fragment() != Fragment::NonFirst);
        let mut f = spec.build();
        rewrite_incrementally(&spec, &mut f, &r);
        prop_assert_eq!(f, rewrite_spec(&spec, &r).build());
    }

    #[test]
    fn update16_matches_recompute_on_random_data(mut data in prop::collection::vec(any::<u8>(), 2..64), at in any::<prop::sample::Index>(), new in any::<u16>()) {
        // Keep one nonzero word so the sum is never the all-zero special case of RFC 1624 §3.
        data[0] |= 1;
        let n = data.len() / 2 * 2;
        let i = at.index(n / 2) * 2;
        let c = checksum::checksum(&data[..n]);
        let old = get16(&data, i);
        put16(&mut data, i, new);
        if i == 0 { data[0] |= 1; }
        let new = get16(&data, i);
        prop_assert_eq!(update16(c, old, new), checksum::checksum(&data[..n]));
    }
}

#[test]
fn udp_over_ipv4_without_checksum_stays_without() {
    let mut f = spillway_wire::build::FrameBuilder::new()
        .ipv4([1, 1, 1, 1], [2, 2, 2, 2])
        .udp(1000, 2000)
        .payload(b"x")
        .build();
    put16(&mut f, 40, 0); // sender chose "no checksum"
    let c = checksum::update_udp_v4_bytes(get16(&f, 40), &[1, 1, 1, 1], &[9, 9, 9, 9]);
    assert_eq!(c, 0);
}
