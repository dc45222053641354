//! IPv6 fixed header (RFC 8200 section 3) and the extension-header walk (section 4).
//!
//! The walk follows hop-by-hop options (only directly after the fixed header, section 4.1),
//! routing (4.4), fragment (4.5) and destination options (4.6), at most
//! [`EXT_HEADERS_MAX`] of them (`TooDeep` beyond). AH (51), ESP (50) and No Next Header (59)
//! end the walk: the flow key then carries that protocol number and zero ports. Jumbograms
//! (payload length 0 with a jumbo option, RFC 2675) are not supported: length 0 means no payload.

use crate::error::{Layer, WireError};
use crate::field::{be16, set16};
use crate::key::ip_proto;

/// Fixed header length.
pub const HEADER_LEN: usize = 40;
/// The most extension headers the walk accepts.
pub const EXT_HEADERS_MAX: usize = 8;
/// ESP (RFC 4303).
pub const PROTO_ESP: u8 = 50;
/// AH (RFC 4302).
pub const PROTO_AH: u8 = 51;

/// A view of an IPv6 packet whose payload length has been checked against the buffer.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps without checks; accessors panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps and checks: 40 bytes, version 6, 40 + payload length <= buffer length.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        let h: &[u8; HEADER_LEN] =
            b.first_chunk()
                .ok_or(WireError::truncated(Layer::Ipv6, HEADER_LEN, b.len()))?;
        if h[0] >> 4 != 6 {
            return Err(WireError::bad_field(
                Layer::Ipv6,
                "version",
                6,
                (h[0] >> 4) as u32,
            ));
        }
        let total = HEADER_LEN + u16::from_be_bytes([h[4], h[5]]) as usize;
        if total > b.len() {
            return Err(WireError::length(
                Layer::Ipv6,
                "payload length",
                (b.len() - HEADER_LEN) as u32,
                (total - HEADER_LEN) as u32,
            ));
        }
        Ok(Ipv6Packet { buffer })
    }

    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        let b = self.buffer.as_ref();
        (b[0] << 4) | (b[1] >> 4)
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([0, b[1] & 0x0f, b[2], b[3]])
    }
    /// Payload length field.
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), 4)
    }
    /// Next header of the fixed header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[6]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[7]
    }
    /// Source address.
    pub fn src_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[8..24]);
        a
    }
    /// Destination address.
    pub fn dst_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[24..40]);
        a
    }
    /// Everything after the fixed header up to the payload length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, h: u8) {
        self.buffer.as_mut()[7] = h;
    }
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, l: u16) {
        set16(self.buffer.as_mut(), 4, l);
    }
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[8..24].copy_from_slice(&a);
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[24..40].copy_from_slice(&a);
    }
}

/// Where the extension-header walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtWalk {
    /// The upper-layer protocol (or AH/ESP/59 when the walk stopped there).
    pub proto: u8,
    /// Offset of the upper-layer header, relative to the start of the IPv6 payload.
    pub l4_offset: usize,
    /// True when the walk stopped at AH, ESP or No Next Header: there are no ports to read.
    pub opaque: bool,
    /// The fragment header's (offset in 8-byte units, M flag), if one was seen.
    pub fragment: Option<(u16, bool)>,
    /// The fragment header's Identification (RFC 8200 section 4.5), 0 without one.
    pub frag_id: u32,
    /// Offset just after the fragment header, relative to the start of the IPv6 payload: where
    /// the fragment's data begins. 0 without one.
    pub frag_end: usize,
    /// How many extension headers were walked.
    pub count: u8,
}

/// Walks the extension headers in `payload` (the bytes after the fixed header, already cut to
/// the payload length), starting from the fixed header's `next_header`. Stops early at a
/// non-first fragment: its contents are not headers.
#[inline]
pub fn walk_ext_headers(mut next: u8, payload: &[u8]) -> Result<ExtWalk, WireError> {
    let mut off = 0usize;
    let mut count = 0usize;
    let mut fragment = None;
    let (mut frag_id, mut frag_end) = (0u32, 0usize);
    loop {
        match next {
            ip_proto::HOPOPT | ip_proto::IPV6_ROUTE | ip_proto::IPV6_FRAG | ip_proto::IPV6_OPTS => {
            }
            PROTO_AH | PROTO_ESP | ip_proto::IPV6_NONXT => {
                return Ok(ExtWalk {
                    proto: next,
                    l4_offset: off,
                    opaque: true,
                    fragment,
                    frag_id,
                    frag_end,
                    count: count as u8,
                });
            }
            _ => {
                return Ok(ExtWalk {
                    proto: next,
                    l4_offset: off,
                    opaque: false,
                    fragment,
                    frag_id,
                    frag_end,
                    count: count as u8,
                });
            }
        }
        if next == ip_proto::HOPOPT && count != 0 {
            return Err(WireError::bad_field(
                Layer::Ipv6Ext,
                "hop-by-hop position",
                0,
                count as u32,
            ));
        }
        if count == EXT_HEADERS_MAX {
            return Err(WireError::too_deep(
                Layer::Ipv6Ext,
                "extension headers",
                EXT_HEADERS_MAX as u32,
                EXT_HEADERS_MAX as u32 + 1,
            ));
        }
        let h: &[u8; 8] = payload
            .get(off..)
            .and_then(|s| s.first_chunk())
            .ok_or(WireError::truncated(Layer::Ipv6Ext, off + 8, payload.len()))?;
        count += 1;
        if next == ip_proto::IPV6_FRAG {
            let fo = u16::from_be_bytes([h[2], h[3]]);
            let (offset, more) = (fo >> 3, fo & 1 != 0);
            fragment = Some((offset, more));
            frag_id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
            next = h[0];
            off += 8;
            frag_end = off;
            if offset != 0 {
                return Ok(ExtWalk {
                    proto: next,
                    l4_offset: off,
                    opaque: true,
                    fragment,
                    frag_id,
                    frag_end,
                    count: count as u8,
                });
            }
        } else {
            let len = (h[1] as usize + 1) * 8;
            if off + len > payload.len() {
                return Err(WireError::truncated(
                    Layer::Ipv6Ext,
                    off + len,
                    payload.len(),
                ));
            }
            next = h[0];
            off += len;
        }
    }
}
