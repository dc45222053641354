//! ARP for IPv4 over Ethernet (RFC 826): the 28-byte packet with hardware type 1, protocol type
//! 0x0800, hardware length 6 and protocol length 4. Spillway recognises and validates ARP but does
//! not route it; anything else with EtherType 0x0806 is a `BadField` error.

use crate::error::{Layer, WireError};
use crate::field::{be16, set16};
use crate::key::MacAddr;

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;
/// Operation: request.
pub const OP_REQUEST: u16 = 1;
/// Operation: reply.
pub const OP_REPLY: u16 = 2;

/// A view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps `buffer` without checks; accessors panic if it is shorter than 28 bytes.
    pub const fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Wraps and validates: 28 bytes, htype 1, ptype 0x0800, hlen 6, plen 4, oper 1 or 2.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < PACKET_LEN {
            return Err(WireError::truncated(Layer::Arp, PACKET_LEN, b.len()));
        }
        let checks: [(&'static str, u32, u32); 5] = [
            ("hardware type", 1, be16(b, 0) as u32),
            ("protocol type", 0x0800, be16(b, 2) as u32),
            ("hardware length", 6, b[4] as u32),
            ("protocol length", 4, b[5] as u32),
            ("operation", OP_REPLY as u32, be16(b, 6) as u32),
        ];
        for (i, (name, want, got)) in checks.into_iter().enumerate() {
            let ok = if i == 4 {
                got == 1 || got == 2
            } else {
                got == want
            };
            if !ok {
                return Err(WireError::bad_field(Layer::Arp, name, want, got));
            }
        }
        Ok(ArpPacket { buffer })
    }

    /// 1 (request) or 2 (reply).
    pub fn operation(&self) -> u16 {
        be16(self.buffer.as_ref(), 6)
    }
    /// Sender hardware address.
    pub fn sender_mac(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[8], b[9], b[10], b[11], b[12], b[13]])
    }
    /// Sender protocol (IPv4) address.
    pub fn sender_ip(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[14], b[15], b[16], b[17]]
    }
    /// Target hardware address.
    pub fn target_mac(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[18], b[19], b[20], b[21], b[22], b[23]])
    }
    /// Target protocol (IPv4) address.
    pub fn target_ip(&self) -> [u8; 4] {
        let b = self.buffer.as_ref();
        [b[24], b[25], b[26], b[27]]
    }
}

/// A decoded Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    /// 1 request, 2 reply.
    pub operation: u16,
    /// Sender MAC.
    pub sender_mac: MacAddr,
    /// Sender IPv4.
    pub sender_ip: [u8; 4],
    /// Target MAC.
    pub target_mac: MacAddr,
    /// Target IPv4.
    pub target_ip: [u8; 4],
}

impl ArpRepr {
    /// Parses and validates.
    pub fn parse(buf: &[u8]) -> Result<ArpRepr, WireError> {
        let p = ArpPacket::new_checked(buf)?;
        Ok(ArpRepr {
            operation: p.operation(),
            sender_mac: p.sender_mac(),
            sender_ip: p.sender_ip(),
            target_mac: p.target_mac(),
            target_ip: p.target_ip(),
        })
    }

    /// Writes the 28 bytes into the front of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        if buf.len() < PACKET_LEN {
            return Err(WireError::truncated(Layer::Arp, PACKET_LEN, buf.len()));
        }
        set16(buf, 0, 1);
        set16(buf, 2, 0x0800);
        buf[4] = 6;
        buf[5] = 4;
        set16(buf, 6, self.operation);
        buf[8..14].copy_from_slice(&self.sender_mac.0);
        buf[14..18].copy_from_slice(&self.sender_ip);
        buf[18..24].copy_from_slice(&self.target_mac.0);
        buf[24..28].copy_from_slice(&self.target_ip);
        Ok(PACKET_LEN)
    }
}
