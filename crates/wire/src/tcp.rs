//! TCP header (RFC 9293 section 3.1): ports, sequence and acknowledgment numbers, data offset
//! (5..=15 words; options allowed), flags, window, checksum, urgent pointer.

use crate::error::{Layer, WireError};
use crate::field::{be16, be32, set16, set32};

/// Minimum TCP header length.
pub const HEADER_LEN: usize = 20;

/// TCP flag bits (byte 13).
pub mod flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;
    /// ECE.
    pub const ECE: u8 = 0x40;
    /// CWR.
    pub const CWR: u8 = 0x80;
}

/// A view of a TCP segment whose header length has been checked.
#[derive(Debug, Clone, Copy)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps without checks; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Wraps and checks: 20 bytes present, data offset >= 5 (`BadField`), header within the
    /// buffer (`Truncated`).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::truncated(Layer::Tcp, HEADER_LEN, b.len()));
        }
        let doff = (b[12] >> 4) as usize;
        if doff < 5 {
            return Err(WireError::bad_field(
                Layer::Tcp,
                "data offset",
                5,
                doff as u32,
            ));
        }
        if doff * 4 > b.len() {
            return Err(WireError::truncated(Layer::Tcp, doff * 4, b.len()));
        }
        Ok(TcpPacket { buffer })
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 0)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.buffer.as_ref(), 4)
    }
    /// Acknowledgment number.
    pub fn ack(&self) -> u32 {
        be32(self.buffer.as_ref(), 8)
    }
    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[12] >> 4) as usize) * 4
    }
    /// Flag byte ([`flags`]).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[13]
    }
    /// Window.
    pub fn window(&self) -> u16 {
        be16(self.buffer.as_ref(), 14)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 16)
    }
    /// Data after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, p: u16) {
        set16(self.buffer.as_mut(), 0, p);
    }
    /// Sets the destination port.
    pub fn set_dst_port(&mut self, p: u16) {
        set16(self.buffer.as_mut(), 2, p);
    }
    /// Sets the sequence number.
    pub fn set_seq(&mut self, v: u32) {
        set32(self.buffer.as_mut(), 4, v);
    }
    /// Sets the acknowledgment number.
    pub fn set_ack(&mut self, v: u32) {
        set32(self.buffer.as_mut(), 8, v);
    }
    /// Sets the flag byte.
    pub fn set_flags(&mut self, f: u8) {
        self.buffer.as_mut()[13] = f;
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        set16(self.buffer.as_mut(), 16, c);
    }
}
