//! ICMP (RFC 792) and ICMPv6 (RFC 4443 section 2.1) share the first 8 bytes: type, code,
//! checksum, then 4 type-specific bytes, which for echo request/reply (ICMP 8/0, ICMPv6 128/129;
//! RFC 792 "Echo or Echo Reply", RFC 4443 section 4) are identifier and sequence number.

use crate::error::{Layer, WireError};
use crate::field::{be16, set16};

/// Length of the common ICMP header.
pub const HEADER_LEN: usize = 8;
/// ICMP echo request type.
pub const V4_ECHO_REQUEST: u8 = 8;
/// ICMP echo reply type.
pub const V4_ECHO_REPLY: u8 = 0;
/// ICMPv6 echo request type.
pub const V6_ECHO_REQUEST: u8 = 128;
/// ICMPv6 echo reply type.
pub const V6_ECHO_REPLY: u8 = 129;

/// A view of an ICMP or ICMPv6 message.
#[derive(Debug, Clone, Copy)]
pub struct IcmpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> IcmpPacket<T> {
    /// Wraps without checks; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        IcmpPacket { buffer }
    }

    /// Wraps and checks that the 8-byte header is present; `layer` is `Icmp` or `Icmpv6`.
    pub fn new_checked(buffer: T, layer: Layer) -> Result<Self, WireError> {
        let n = buffer.as_ref().len();
        if n < HEADER_LEN {
            return Err(WireError::truncated(layer, HEADER_LEN, n));
        }
        Ok(IcmpPacket { buffer })
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// Code.
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[1]
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), 2)
    }
    /// Echo identifier (bytes 4..6; meaningful for echo messages only).
    pub fn echo_ident(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// Echo sequence number (bytes 6..8).
    pub fn echo_seq(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> IcmpPacket<T> {
    /// Sets the echo identifier.
    pub fn set_echo_ident(&mut self, id: u16) {
        set16(self.buffer.as_mut(), 4, id);
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        set16(self.buffer.as_mut(), 2, c);
    }
}

/// True for echo request/reply of the given family, whose identifier goes in both ports of a
/// [`crate::FlowKey`].
#[inline(always)]
pub const fn is_echo(v6: bool, msg_type: u8) -> bool {
    if v6 {
        matches!(msg_type, V6_ECHO_REQUEST | V6_ECHO_REPLY)
    } else {
        matches!(msg_type, V4_ECHO_REQUEST | V4_ECHO_REPLY)
    }
}
