//! IPv4 header (RFC 791 section 3.1). Options are allowed (IHL 5..=15); the total length must
//! cover the header and fit in the buffer, and bytes past it (Ethernet padding) are ignored.
//! Fragmentation fields: MF flag and the 13-bit offset in 8-byte units.

use crate::checksum;
use crate::error::{Layer, WireError};
use crate::field::{be16, set16};

/// Minimum header length (IHL 5).
pub const HEADER_LEN: usize = 20;
/// "More fragments" flag in the flags/offset word.
pub const FLAG_MF: u16 = 0x2000;
/// "Don't fragment" flag in the flags/offset word.
pub const FLAG_DF: u16 = 0x4000;
/// Fragment offset mask (8-byte units).
pub const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet whose header and total length have been checked.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps `buffer` without checks; accessors panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    /// Wraps and checks: 20 bytes, version 4, IHL >= 5, header present, and
    /// header length <= total length <= buffer length.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        let h: &[u8; HEADER_LEN] =
            b.first_chunk()
                .ok_or(WireError::truncated(Layer::Ipv4, HEADER_LEN, b.len()))?;
        if h[0] >> 4 != 4 {
            return Err(WireError::bad_field(
                Layer::Ipv4,
                "version",
                4,
                (h[0] >> 4) as u32,
            ));
        }
        let ihl = (h[0] & 0x0f) as usize;
        if ihl < 5 {
            return Err(WireError::bad_field(Layer::Ipv4, "ihl", 5, ihl as u32));
        }
        let hlen = ihl * 4;
        if b.len() < hlen {
            return Err(WireError::truncated(Layer::Ipv4, hlen, b.len()));
        }
        let total = u16::from_be_bytes([h[2], h[3]]) as usize;
        if total < hlen {
            return Err(WireError::length(
                Layer::Ipv4,
                "total length",
                hlen as u32,
                total as u32,
            ));
        }
        if total > b.len() {
            return Err(WireError::length(
                Layer::Ipv4,
                "total length",
                b.len() as u32,
                total as u32,
            ));
        }
        Ok(Ipv4Packet { buffer })
    }

    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[0] & 0x0f) as usize) * 4
    }
    /// DSCP/ECN byte.
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Total length field.
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Identification.
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        be16(self.buffer.as_ref(), 6) & FLAG_MF != 0
    }
    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        be16(self.buffer.as_ref(), 6) & FLAG_DF != 0
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        be16(self.buffer.as_ref(), 6) & OFFSET_MASK
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[8]
    }
    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[9]
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 10)
    }
    /// Source address.
    pub fn src_addr(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[12], b[13], b[14], b[15]]
    }
    /// Destination address.
    pub fn dst_addr(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[16], b[17], b[18], b[19]]
    }
    /// The options bytes (empty for IHL 5).
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.header_len()]
    }
    /// True when the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::ipv4_header_valid(&self.buffer.as_ref()[..self.header_len()])
    }
    /// The payload up to the total length (Ethernet padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets the TTL (the header checksum is not updated; see [`checksum::update16`]).
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[8] = ttl;
    }
    /// Sets the source address (checksum not updated).
    pub fn set_src_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[12..16].copy_from_slice(&a);
    }
    /// Sets the destination address (checksum not updated).
    pub fn set_dst_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[16..20].copy_from_slice(&a);
    }
    /// Sets the total length (checksum not updated).
    pub fn set_total_len(&mut self, len: u16) {
        set16(self.buffer.as_mut(), 2, len);
    }
    /// Recomputes and writes the header checksum.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        let c = checksum::ipv4_header_checksum(&self.buffer.as_ref()[..hl]);
        set16(self.buffer.as_mut(), 10, c);
    }
}
