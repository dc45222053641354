//! The virtio-net header that prefixes every frame on a TAP opened with `IFF_VNET_HDR`.
//!
//! A TAP with a vnet header is how the kernel hands us offloaded traffic without doing the
//! work itself: a frame may carry a *partial* checksum (`NEEDS_CSUM`: the stack filled in only
//! the pseudo-header sum and says where the rest goes) or be a *GSO super-frame* of up to 64 KiB
//! that a virtio device would segment (`gso_type` != `NONE`). Passing these through untouched
//! is what makes the TAP path cheap, so the header is parsed and emitted here byte for byte.
//!
//! The layout is `struct virtio_net_hdr_v1` (virtio 1.x, section 5.1.6 "Device Operation"),
//! 12 bytes, every multi-byte field little-endian. [`crate::host::tap`] sets `TUNSETVNETLE` so the
//! kernel uses little-endian on any host, and `TUNSETVNETHDRSZ` = 12 so `num_buffers` is present.
//!
//! ```text
//!  0       1       2              4              6              8              10             12
//!  +-------+-------+--------------+--------------+--------------+--------------+--------------+
//!  | flags |gso_typ|   hdr_len    |   gso_size   |  csum_start  | csum_offset  | num_buffers  |
//!  +-------+-------+--------------+--------------+--------------+--------------+--------------+
//! ```
//!
//! [`complete_checksum`] finishes a partial checksum in software, for when a frame read from a
//! TAP must go somewhere that cannot take a partial one (a pcap, a tunnel, another host).
//! Software segmentation of GSO frames is deliberately not provided.

use thiserror::Error;

/// Errors from parsing or emitting a [`VnetHdr`] or completing a checksum. `Copy`: this is
/// data-path code and the caller usually counts the error and drops the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum VnetError {
    /// The buffer is shorter than the 12-byte header.
    #[error("virtio-net header needs {expected} bytes, buffer has {actual}")]
    Truncated {
        /// Bytes the header needs ([`VnetHdr::LEN`]).
        expected: usize,
        /// Bytes available.
        actual: usize,
    },
    /// `csum_start` / `csum_offset` point outside the frame, so the checksum cannot be placed.
    #[error(
        "checksum field out of bounds: csum_start {csum_start} + csum_offset {csum_offset} \
         (+2 bytes) in a {frame_len}-byte frame"
    )]
    ChecksumOutOfBounds {
        /// `csum_start` from the header: where the checksummed range begins.
        csum_start: u16,
        /// `csum_offset` from the header: where the 16-bit result goes, relative to `csum_start`.
        csum_offset: u16,
        /// Length of the frame that was given (without the vnet header).
        frame_len: usize,
    },
}

/// `struct virtio_net_hdr_v1`: the 12-byte header in front of each frame on a vnet-header TAP.
///
/// Fields are kept in host order; [`VnetHdr::parse`] and [`VnetHdr::emit`] convert from and to
/// the little-endian wire form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*` bits: [`VnetHdr::F_NEEDS_CSUM`], [`VnetHdr::F_DATA_VALID`].
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`: [`VnetHdr::GSO_NONE`], [`VnetHdr::GSO_TCPV4`], ... possibly with
    /// [`VnetHdr::GSO_ECN`] or-ed in.
    pub gso_type: u8,
    /// Length of the headers (Ethernet + IP + L4) that every segment repeats; a hint only.
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS) when `gso_type` is not `NONE`.
    pub gso_size: u16,
    /// Offset in the frame (after this header) where checksumming starts, for `NEEDS_CSUM`.
    pub csum_start: u16,
    /// Offset from `csum_start` where the 16-bit checksum is stored, for `NEEDS_CSUM`.
    pub csum_offset: u16,
    /// Buffers merged into this frame (mergeable receive buffers). The TAP driver does not
    /// write it on read (it skips over the two bytes), so its value on read is meaningless.
    pub num_buffers: u16,
}

impl VnetHdr {
    /// Length of the header on the wire (`virtio_net_hdr_v1`, as set with `TUNSETVNETHDRSZ`).
    pub const LEN: usize = 12;

    /// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` holds only the
    /// pseudo-header sum; the rest from `csum_start` to the end still has to be added.
    pub const F_NEEDS_CSUM: u8 = 1;
    /// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was already verified (receive side).
    pub const F_DATA_VALID: u8 = 2;

    /// `VIRTIO_NET_HDR_GSO_NONE`: a single frame, not a GSO super-frame.
    pub const GSO_NONE: u8 = 0;
    /// `VIRTIO_NET_HDR_GSO_TCPV4`: TCP over IPv4, segmented at `gso_size` (TSO).
    pub const GSO_TCPV4: u8 = 1;
    /// `VIRTIO_NET_HDR_GSO_UDP`: UDP fragmentation offload (UFO, legacy).
    pub const GSO_UDP: u8 = 3;
    /// `VIRTIO_NET_HDR_GSO_TCPV6`: TCP over IPv6, segmented at `gso_size` (TSO).
    pub const GSO_TCPV6: u8 = 4;
    /// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation offload (USO), IPv4 or IPv6.
    pub const GSO_UDP_L4: u8 = 5;
    /// `VIRTIO_NET_HDR_GSO_ECN`: or-ed into `gso_type` when the TCP segments carry ECN (CWR).
    pub const GSO_ECN: u8 = 0x80;

    /// The all-zero header: no checksum work pending, not GSO. What to put in front of an
    /// ordinary, fully checksummed frame.
    pub const NONE: VnetHdr = VnetHdr {
        flags: 0,
        gso_type: Self::GSO_NONE,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
        num_buffers: 0,
    };

    /// Parses the header from the first [`VnetHdr::LEN`] bytes of `bytes`; the rest is ignored.
    pub fn parse(bytes: &[u8]) -> Result<VnetHdr, VnetError> {
        let b: &[u8; Self::LEN] = bytes
            .get(..Self::LEN)
            .and_then(|s| s.try_into().ok())
            .ok_or(VnetError::Truncated {
                expected: Self::LEN,
                actual: bytes.len(),
            })?;
        let le16 = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le16(2),
            gso_size: le16(4),
            csum_start: le16(6),
            csum_offset: le16(8),
            num_buffers: le16(10),
        })
    }

    /// Writes the header into the first [`VnetHdr::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), VnetError> {
        let actual = out.len();
        let out = out.get_mut(..Self::LEN).ok_or(VnetError::Truncated {
            expected: Self::LEN,
            actual,
        })?;
        out.copy_from_slice(&self.to_bytes());
        Ok(())
    }

    /// The header in its 12-byte wire form.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        b
    }

    /// True when the frame is a GSO super-frame (any type other than `NONE`, ignoring the ECN
    /// bit), i.e. it may be larger than the MTU and must be segmented before a real wire.
    pub fn is_gso(&self) -> bool {
        self.gso_type & !Self::GSO_ECN != Self::GSO_NONE
    }

    /// The GSO segment size the vSwitch measures this frame's packets by
    /// ([`spillway_vswitch::PacketBuf::set_gso_size`]): `gso_size` for a super-frame, else 0.
    pub fn gso_segment(&self) -> u16 {
        if self.is_gso() { self.gso_size } else { 0 }
    }

    /// True when `F_NEEDS_CSUM` is set: the frame carries a partial checksum.
    pub fn needs_csum(&self) -> bool {
        self.flags & Self::F_NEEDS_CSUM != 0
    }
}

/// The header to send a frame the vSwitch processed with: `original`, the one it came with,
/// unless the vSwitch replaced the frame with one of its own (an ICMP error, an ARP or ND
/// answer: complete checksums, no offload), which leaves with the all-zero header. Written once
/// here for every driver that passes virtio-net headers through.
pub fn header_after<'a>(
    pkt: &spillway_vswitch::PacketBuf,
    original: &'a [u8; VnetHdr::LEN],
) -> &'a [u8; VnetHdr::LEN] {
    const PLAIN: [u8; VnetHdr::LEN] = [0; VnetHdr::LEN];
    if pkt.is_generated() { &PLAIN } else { original }
}

/// Finishes a partial checksum in `frame` (the frame after the vnet header) as `hdr` describes.
///
/// With `F_NEEDS_CSUM` set, the 16-bit field at `csum_start + csum_offset` holds the folded
/// pseudo-header sum; adding every byte from `csum_start` to the end of the frame (the field
/// included) and complementing gives the final Internet checksum (RFC 1071), which is stored
/// in that field. This is what the kernel's `skb_checksum_help` does. Without the flag the
/// frame is left alone. The caller should then forward the frame with the flag cleared.
///
/// A GSO super-frame gets a checksum over the whole super-frame, which is only meaningful once
/// it is segmented; callers that cannot segment should not complete checksums of GSO frames.
pub fn complete_checksum(frame: &mut [u8], hdr: &VnetHdr) -> Result<(), VnetError> {
    if !hdr.needs_csum() {
        return Ok(());
    }
    let start = usize::from(hdr.csum_start);
    let field = start + usize::from(hdr.csum_offset);
    // The field must lie inside the summed range, or the "sum includes the seed" trick fails.
    if field + 2 > frame.len() {
        return Err(VnetError::ChecksumOutOfBounds {
            csum_start: hdr.csum_start,
            csum_offset: hdr.csum_offset,
            frame_len: frame.len(),
        });
    }
    let sum = ones_complement_sum(&frame[start..]);
    let mut csum = !sum;
    // A computed 0 is sent as 0xffff (equal in ones' complement): for UDP, 0 on the wire would
    // mean "no checksum". The kernel does the same (CSUM_MANGLED_0).
    if csum == 0 {
        csum = 0xffff;
    }
    frame[field..field + 2].copy_from_slice(&csum.to_be_bytes());
    Ok(())
}

/// The folded 16-bit ones' complement sum of `data` read as big-endian words, an odd last
/// byte padded with zero (RFC 1071 section 4.1).
fn ones_complement_sum(data: &[u8]) -> u16 {
    // A u64 accumulator cannot overflow for any frame (< 2^48 words), so fold once at the end.
    let mut chunks = data.chunks_exact(2);
    let mut acc: u64 = chunks
        .by_ref()
        .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    if let [last] = chunks.remainder() {
        acc += u64::from(*last) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    u16::try_from(acc).expect("folded to 16 bits by the loop above")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A header the kernel would write for a TSO frame: NEEDS_CSUM, TCPV4, hdr_len 66,
    /// gso_size 1448, csum at 34 + 16.
    const GOLDEN_TSO: [u8; 12] = [
        0x01, 0x01, 0x42, 0x00, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn parse_reads_little_endian_fields() {
        let h = VnetHdr::parse(&GOLDEN_TSO).unwrap();
        assert_eq!(
            h,
            VnetHdr {
                flags: VnetHdr::F_NEEDS_CSUM,
                gso_type: VnetHdr::GSO_TCPV4,
                hdr_len: 66,
                gso_size: 1448,
                csum_start: 34,
                csum_offset: 16,
                num_buffers: 0,
            }
        );
        assert!(h.is_gso());
        assert!(h.needs_csum());
    }

    #[test]
    fn emit_writes_golden_bytes_and_round_trips() {
        let h = VnetHdr::parse(&GOLDEN_TSO).unwrap();
        let mut out = [0xeeu8; 14];
        h.emit(&mut out).unwrap();
        assert_eq!(out[..12], GOLDEN_TSO);
        assert_eq!(
            out[12..],
            [0xee, 0xee],
            "emit must not write past the header"
        );
        assert_eq!(VnetHdr::NONE.to_bytes(), [0u8; 12]);
    }

    #[test]
    fn parse_and_emit_reject_short_buffers() {
        assert_eq!(
            VnetHdr::parse(&GOLDEN_TSO[..11]),
            Err(VnetError::Truncated {
                expected: 12,
                actual: 11
            })
        );
        assert_eq!(
            VnetHdr::NONE.emit(&mut [0u8; 3]),
            Err(VnetError::Truncated {
                expected: 12,
                actual: 3
            })
        );
    }

    #[test]
    fn is_gso_ignores_the_ecn_bit() {
        let mut h = VnetHdr::NONE;
        assert!(!h.is_gso());
        h.gso_type = VnetHdr::GSO_ECN;
        assert!(!h.is_gso());
        h.gso_type = VnetHdr::GSO_TCPV6 | VnetHdr::GSO_ECN;
        assert!(h.is_gso());
        h.gso_type = VnetHdr::GSO_UDP_L4;
        assert!(h.is_gso());
    }

    /// An IPv4/UDP frame 10.0.0.1:1234 -> 10.0.0.2:5678 with payload "hi", its UDP checksum
    /// field holding only the pseudo-header sum, as the kernel writes it under NEEDS_CSUM.
    fn udp_frame() -> Vec<u8> {
        let mut f = vec![
            // Ethernet: dst, src, IPv4
            0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00,
            // IPv4: v4 ihl5, tos, len 30, id, frag, ttl 64, udp, csum (not ours), src, dst
            0x45, 0, 0, 30, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            // UDP: 1234 -> 5678, len 10, csum (partial below), "hi"
            0x04, 0xd2, 0x16, 0x2e, 0, 10, 0, 0, b'h', b'i',
        ];
        // Pseudo-header: src 0x0a00 + 0x0001 + dst 0x0a00 + 0x0002 + proto 17 + len 10.
        let pseudo: u32 = 0x0a00 + 0x0001 + 0x0a00 + 0x0002 + 17 + 10;
        f[40..42].copy_from_slice(&u16::try_from(pseudo).unwrap().to_be_bytes());
        f
    }

    #[test]
    fn complete_checksum_matches_hand_computed_udp_checksum() {
        let mut f = udp_frame();
        let hdr = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 6,
            ..VnetHdr::NONE
        };
        complete_checksum(&mut f, &hdr).unwrap();
        // Pseudo-header 0x141e + ports 0x04d2 + 0x162e + length 0x000a + "hi" 0x6869 = 0x9791,
        // and !0x9791 = 0x686e.
        assert_eq!(f[40..42], [0x68, 0x6e]);
        // Verifying: the full sum including the stored checksum folds to 0xffff.
        let pseudo = [10u8, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, 10];
        let mut all = pseudo.to_vec();
        all.extend_from_slice(&f[34..]);
        assert_eq!(ones_complement_sum(&all), 0xffff);
    }

    #[test]
    fn complete_checksum_leaves_frames_without_needs_csum_alone() {
        let mut f = udp_frame();
        let before = f.clone();
        complete_checksum(&mut f, &VnetHdr::NONE).unwrap();
        assert_eq!(f, before);
    }

    #[test]
    fn complete_checksum_rejects_out_of_bounds_offsets() {
        let mut f = udp_frame();
        let hdr = VnetHdr {
            flags: VnetHdr::F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 9, // field at 43..45, frame is 44 bytes
            ..VnetHdr::NONE
        };
        assert_eq!(
            complete_checksum(&mut f, &hdr),
            Err(VnetError::ChecksumOutOfBounds {
                csum_start: 34,
                csum_offset: 9,
                frame_len: 44
            })
        );
        let far = VnetHdr {
            csum_start: u16::MAX,
            csum_offset: u16::MAX,
            ..hdr
        };
        assert!(complete_checksum(&mut f, &far).is_err());
    }

    #[test]
    fn ones_complement_sum_pads_an_odd_last_byte() {
        assert_eq!(ones_complement_sum(&[]), 0);
        assert_eq!(ones_complement_sum(&[0x12]), 0x1200);
        assert_eq!(ones_complement_sum(&[0xff, 0xff, 0x00, 0x01]), 0x0001);
        // RFC 1071 section 3 example: 0001 f203 f4f5 f6f7 -> ddf2.
        assert_eq!(
            ones_complement_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_round_trips(
            bytes in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            match VnetHdr::parse(&bytes) {
                Ok(h) => prop_assert_eq!(&h.to_bytes()[..], &bytes[..12]),
                Err(e) => {
                    let want = VnetError::Truncated { expected: 12, actual: bytes.len() };
                    prop_assert_eq!(e, want);
                }
            }
        }

        #[test]
        fn completed_checksum_verifies(
            mut frame in proptest::collection::vec(any::<u8>(), 0..200),
            start in 0u16..220,
            offset in 0u16..220,
        ) {
            let hdr = VnetHdr {
                flags: VnetHdr::F_NEEDS_CSUM,
                csum_start: start,
                csum_offset: offset,
                ..VnetHdr::NONE
            };
            let fits = usize::from(start) + usize::from(offset) + 2 <= frame.len();
            let seed = if fits {
                let f = usize::from(start) + usize::from(offset);
                u16::from_be_bytes([frame[f], frame[f + 1]])
            } else { 0 };
            match complete_checksum(&mut frame, &hdr) {
                Ok(()) => {
                    prop_assert!(fits);
                    // With the seed (the pseudo-header sum) put back, the range sums to S and
                    // the stored checksum is !S (or 0xffff for S = 0xffff): together all ones.
                    let f = usize::from(start) + usize::from(offset);
                    let stored = u16::from_be_bytes([frame[f], frame[f + 1]]);
                    frame[f..f + 2].copy_from_slice(&seed.to_be_bytes());
                    let range_sum = ones_complement_sum(&frame[usize::from(start)..]);
                    let mut t = u32::from(range_sum) + u32::from(stored);
                    while t > 0xffff { t = (t & 0xffff) + (t >> 16); }
                    prop_assert_eq!(t, 0xffff);
                    prop_assert_ne!(stored, 0);
                }
                Err(_) => prop_assert!(!fits),
            }
        }
    }
}
