//! UDP header (RFC 768): ports, length (header + data, at least 8) and checksum (0 = none over
//! IPv4; mandatory over IPv6, RFC 8200 section 8.1).

use crate::error::{Layer, WireError};
use crate::field::{be16, set16};

/// UDP header length.
pub const HEADER_LEN: usize = 8;

/// A view of a UDP datagram whose length field has been checked against the buffer.
#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps without checks; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps and checks: 8 bytes present, 8 <= length <= buffer length.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::truncated(Layer::Udp, HEADER_LEN, b.len()));
        }
        let len = be16(b, 4) as usize;
        if len < HEADER_LEN {
            return Err(WireError::length(
                Layer::Udp,
                "length",
                HEADER_LEN as u32,
                len as u32,
            ));
        }
        if len > b.len() {
            return Err(WireError::length(
                Layer::Udp,
                "length",
                b.len() as u32,
                len as u32,
            ));
        }
        Ok(UdpPacket { buffer })
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Length field.
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// True when the length field says there is no data.
    pub fn is_empty(&self) -> bool {
        self.len() as usize == HEADER_LEN
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
    /// Data up to the length field.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, p: u16) {
        set16(self.buffer.as_mut(), 0, p);
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, p: u16) {
        set16(self.buffer.as_mut(), 2, p);
    }
    /// Sets the length field.
    pub fn set_len(&mut self, l: u16) {
        set16(self.buffer.as_mut(), 4, l);
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        set16(self.buffer.as_mut(), 6, c);
    }
}
