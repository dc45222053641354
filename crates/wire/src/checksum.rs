//! The Internet checksum: RFC 1071 one's complement sum, the IPv4 header checksum (RFC 791
//! section 3.1), the TCP/UDP/ICMPv6 pseudo-header checksums (RFC 9293 section 3.1, RFC 768,
//! RFC 8200 section 8.1) and RFC 1624 incremental updates for NAT-style rewrites.
//!
//! Conventions. A *sum* (`u32`) is an unfolded running one's complement sum of 16-bit big-endian
//! words; [`fold`] turns it into 16 bits; a *checksum* (`u16`) is the complement of the folded
//! sum, as it is written on the wire. Odd-length data is padded with one zero byte (RFC 1071
//! section 4.1), which is why a running sum must only be continued over even-length pieces.
//!
//! UDP over IPv4 uses the checksum value 0 to mean "no checksum" (RFC 768): a computed 0 is sent
//! as 0xffff ([`udp_v4_wire`]), and [`update_udp_v4_16`]/[`update_udp_v4_bytes`] keep a 0 at 0.

/// The RFC 1071 sum of `data`, added to `initial`. Not folded; fold before complementing.
#[inline]
pub fn sum(data: &[u8], initial: u32) -> u32 {
    // Sum 32-bit big-endian chunks into a u64 so that carries never overflow, then fold the
    // 32-bit halves: one's complement addition is associative, so word size is free to choose.
    let mut acc: u64 = initial as u64;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        acc += u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64;
    }
    let rest = chunks.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc += u32::from_be_bytes(tail) as u64;
    // Fold 64 -> 32 bits with end-around carry, twice to absorb the carry of the first add.
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    acc = (acc & 0xffff_ffff) + (acc >> 32);
    let s = acc as u32;
    // Fold 32 -> 17 bits so the result can be added to further u32 sums without overflow.
    (s & 0xffff) + (s >> 16)
}

/// Folds a running sum to 16 bits with end-around carry (not complemented).
#[inline]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// The Internet checksum of `data`: the complement of its folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data, 0))
}

/// The IPv4 header checksum of `header` (the whole header, options included), computed as if
/// the checksum field (bytes 10..12) were zero. RFC 791 section 3.1.
#[inline]
pub fn ipv4_header_checksum(header: &[u8]) -> u16 {
    let s = sum(header, 0);
    let field = match header.get(10..12) {
        Some(f) => u16::from_be_bytes([f[0], f[1]]),
        None => 0,
    };
    // Subtracting in one's complement is adding the complement.
    !fold(s + (!field) as u32)
}

/// True when the IPv4 header's checksum field is correct (the header sums to 0xffff).
#[inline]
pub fn ipv4_header_valid(header: &[u8]) -> bool {
    fold(sum(header, 0)) == 0xffff
}

/// The sum of the IPv4 pseudo header (source, destination, zero, protocol, L4 length).
#[inline]
pub fn pseudo_header_v4(src: [u8; 4], dst: [u8; 4], proto: u8, l4_len: u16) -> u32 {
    u16::from_be_bytes([src[0], src[1]]) as u32
        + u16::from_be_bytes([src[2], src[3]]) as u32
        + u16::from_be_bytes([dst[0], dst[1]]) as u32
        + u16::from_be_bytes([dst[2], dst[3]]) as u32
        + proto as u32
        + l4_len as u32
}

/// The sum of the IPv6 pseudo header (RFC 8200 section 8.1: source, destination, upper-layer
/// length as 32 bits, three zero bytes, next header).
#[inline]
pub fn pseudo_header_v6(src: &[u8; 16], dst: &[u8; 16], proto: u8, l4_len: u32) -> u32 {
    sum(src, 0) + sum(dst, 0) + (l4_len >> 16) + (l4_len & 0xffff) + proto as u32
}

/// The TCP/UDP/ICMP checksum over an IPv4 pseudo header and `segment` (header plus data), with
/// the segment's checksum field zeroed by the caller. For UDP pass the result to
/// [`udp_v4_wire`] before writing it. `segment` longer than 65535 bytes is the caller's bug.
#[inline]
pub fn l4_checksum_v4(src: [u8; 4], dst: [u8; 4], proto: u8, segment: &[u8]) -> u16 {
    !fold(sum(
        segment,
        pseudo_header_v4(src, dst, proto, segment.len() as u16),
    ))
}

/// The TCP/UDP/ICMPv6 checksum over an IPv6 pseudo header and `segment`, checksum field zeroed.
/// A UDP checksum that computes to 0 is sent as 0xffff (RFC 8200 section 8.1).
#[inline]
pub fn l4_checksum_v6(src: &[u8; 16], dst: &[u8; 16], proto: u8, segment: &[u8]) -> u16 {
    !fold(sum(
        segment,
        pseudo_header_v6(src, dst, proto, segment.len() as u32),
    ))
}

/// True when `segment` (checksum field as received) verifies against the IPv4 pseudo header.
#[inline]
pub fn verify_l4_v4(src: [u8; 4], dst: [u8; 4], proto: u8, segment: &[u8]) -> bool {
    fold(sum(
        segment,
        pseudo_header_v4(src, dst, proto, segment.len() as u16),
    )) == 0xffff
}

/// True when `segment` (checksum field as received) verifies against the IPv6 pseudo header.
#[inline]
pub fn verify_l4_v6(src: &[u8; 16], dst: &[u8; 16], proto: u8, segment: &[u8]) -> bool {
    fold(sum(
        segment,
        pseudo_header_v6(src, dst, proto, segment.len() as u32),
    )) == 0xffff
}

/// Maps a computed UDP checksum to its wire form: 0 becomes 0xffff, because 0 on the wire means
/// "no checksum" (RFC 768; RFC 8200 section 8.1 for IPv6).
#[inline]
pub const fn udp_v4_wire(csum: u16) -> u16 {
    if csum == 0 { 0xffff } else { csum }
}

/// RFC 1624 eqn. 3 for one 16-bit field changing from `old` to `new`:
/// `HC' = ~(~HC + ~m + m')`.
#[inline]
pub const fn update16(csum: u16, old: u16, new: u16) -> u16 {
    !fold((!csum) as u32 + (!old) as u32 + new as u32)
}

/// RFC 1624 eqn. 3 for one aligned 32-bit field (two 16-bit words) changing.
#[inline]
pub const fn update32(csum: u16, old: u32, new: u32) -> u16 {
    let s = (!csum) as u32
        + (!(old >> 16) as u16) as u32
        + (!(old as u16)) as u32
        + (new >> 16)
        + (new & 0xffff);
    !fold(s)
}

/// RFC 1624 eqn. 3 for a field of even length starting at an even offset (an IPv4 address of 4
/// bytes, an IPv6 address of 16) changing from `old` to `new`. Panics in debug builds when the
/// lengths differ or are odd.
#[inline]
pub fn update_bytes(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert!(old.len() == new.len() && old.len().is_multiple_of(2));
    let mut s = (!csum) as u32;
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        s += (!u16::from_be_bytes([o[0], o[1]])) as u32 + u16::from_be_bytes([n[0], n[1]]) as u32;
        // Keep the accumulator small enough for 16-byte inputs: fold every step.
        s = (s & 0xffff) + (s >> 16);
    }
    !fold(s)
}

/// [`update16`] for an IPv4 UDP checksum: 0 ("none") stays 0 and a result of 0 is sent as 0xffff.
#[inline]
pub const fn update_udp_v4_16(csum: u16, old: u16, new: u16) -> u16 {
    if csum == 0 {
        0
    } else {
        udp_v4_wire(update16(csum, old, new))
    }
}

/// [`update_bytes`] for an IPv4 UDP checksum: 0 ("none") stays 0, a result of 0 becomes 0xffff.
#[inline]
pub fn update_udp_v4_bytes(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    if csum == 0 {
        0
    } else {
        udp_v4_wire(update_bytes(csum, old, new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 section 3 worked example: the words 0001 f203 f4f5 f6f7 sum to ddf2.
    #[test]
    fn rfc1071_example_sum() {
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data, 0)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    /// A well-known IPv4 header (Wikipedia "IPv4 header checksum" example) has checksum b861.
    #[test]
    fn ipv4_header_checksum_golden() {
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(ipv4_header_checksum(&h), 0xb861);
        assert!(ipv4_header_valid(&h));
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(fold(sum(&[0x12, 0x34, 0x56], 0)), 0x1234 + 0x5600);
    }

    #[test]
    fn update16_matches_recompute() {
        let mut d = [0x45u8, 0x00, 0x12, 0x34, 0xab, 0xcd];
        let c = checksum(&d);
        d[2..4].copy_from_slice(&0xfeedu16.to_be_bytes());
        assert_eq!(update16(c, 0x1234, 0xfeed), checksum(&d));
    }

    #[test]
    fn udp_zero_checksum_stays_zero() {
        assert_eq!(update_udp_v4_16(0, 1, 2), 0);
        assert_eq!(update_udp_v4_bytes(0, &[1, 2, 3, 4], &[5, 6, 7, 8]), 0);
    }
}
