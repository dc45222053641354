//! ICMP (RFC 792) and ICMPv6 (RFC 4443 section 2.1) share the first 8 bytes: type, code,
//! checksum, then 4 type-specific bytes, which for echo request/reply (ICMP 8/0, ICMPv6 128/129;
//! RFC 792 "Echo or Echo Reply", RFC 4443 section 4) are identifier and sequence number.
//!
//! For connection tracking a message is a query (a request that may open state), the reply to a
//! query, an error (carrying the header of the packet that caused it), or something else; see
//! [`kind`]. The query/reply pairs are those Linux `nf_conntrack` tracks (`invmap` in
//! `nf_conntrack_proto_icmp.c` and `nf_conntrack_proto_icmpv6.c`): for ICMP echo (8/0),
//! timestamp (13/14, RFC 792), information (15/16, RFC 792) and address mask (17/18, RFC 950);
//! for ICMPv6 echo (128/129) and node information (139/140, RFC 4620). Each carries a 16-bit
//! identifier in bytes 4..6.

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
/// ICMP destination unreachable (RFC 792).
pub const V4_DEST_UNREACHABLE: u8 = 3;
/// ICMP time exceeded (RFC 792).
pub const V4_TIME_EXCEEDED: u8 = 11;
/// ICMPv6 destination unreachable (RFC 4443 section 3.1).
pub const V6_DEST_UNREACHABLE: u8 = 1;
/// ICMPv6 packet too big (RFC 4443 section 3.2).
pub const V6_PACKET_TOO_BIG: u8 = 2;
/// ICMPv6 time exceeded (RFC 4443 section 3.3).
pub const V6_TIME_EXCEEDED: u8 = 3;

/// What an ICMP or ICMPv6 message type is to connection tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IcmpKind {
    /// A query that may open a connection (echo request and the other request types).
    Request,
    /// The answer to a query; only ever valid on a tracked connection.
    Reply,
    /// An error message, which carries the IP header and first 8 bytes of the offending packet
    /// (ICMP 3, 4, 5, 11, 12 as `icmp_is_err` in Linux; ICMPv6 types below 128, RFC 4443
    /// section 2.1).
    Error,
    /// Anything else (router and neighbour discovery, MLD, unassigned types).
    Other,
}

/// The kind of message type `msg_type` of ICMP (`v6 == false`) or ICMPv6.
#[inline(always)]
pub const fn kind(v6: bool, msg_type: u8) -> IcmpKind {
    if v6 {
        match msg_type {
            128 | 139 => IcmpKind::Request,
            129 | 140 => IcmpKind::Reply,
            0..=127 => IcmpKind::Error,
            _ => IcmpKind::Other,
        }
    } else {
        match msg_type {
            8 | 13 | 15 | 17 => IcmpKind::Request,
            0 | 14 | 16 | 18 => IcmpKind::Reply,
            3 | 4 | 5 | 11 | 12 => IcmpKind::Error,
            _ => IcmpKind::Other,
        }
    }
}

/// The type answering a request, or requested by a reply (`nf_conntrack`'s `invmap`); `None`
/// for errors and other types.
#[inline(always)]
pub const fn counterpart(v6: bool, msg_type: u8) -> Option<u8> {
    if v6 {
        match msg_type {
            128 => Some(129),
            129 => Some(128),
            139 => Some(140),
            140 => Some(139),
            _ => None,
        }
    } else {
        match msg_type {
            8 => Some(0),
            0 => Some(8),
            13 => Some(14),
            14 => Some(13),
            15 => Some(16),
            16 => Some(15),
            17 => Some(18),
            18 => Some(17),
            _ => None,
        }
    }
}

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

/// True for queries and their replies ([`IcmpKind::Request`], [`IcmpKind::Reply`]), whose
/// identifier goes in the source port of a [`crate::FlowKey`].
#[inline(always)]
pub const fn is_query(v6: bool, msg_type: u8) -> bool {
    counterpart(v6, msg_type).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counterpart_is_an_involution_between_requests_and_replies() {
        for v6 in [false, true] {
            for t in 0..=255u8 {
                match (kind(v6, t), counterpart(v6, t)) {
                    (IcmpKind::Request, Some(r)) => {
                        assert_eq!(kind(v6, r), IcmpKind::Reply);
                        assert_eq!(counterpart(v6, r), Some(t));
                    }
                    (IcmpKind::Reply, Some(q)) => assert_eq!(kind(v6, q), IcmpKind::Request),
                    (IcmpKind::Error | IcmpKind::Other, None) => {}
                    other => panic!("v6 {v6} type {t}: {other:?}"),
                }
            }
        }
        assert_eq!(kind(false, V4_ECHO_REQUEST), IcmpKind::Request);
        assert_eq!(kind(true, V6_PACKET_TOO_BIG), IcmpKind::Error);
        assert_eq!(kind(true, 135), IcmpKind::Other);
        assert_eq!(kind(false, 9), IcmpKind::Other);
    }
}
