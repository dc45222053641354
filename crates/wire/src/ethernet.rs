//! Ethernet II (IEEE 802.3 clause 3.2.6 "Length/Type") and 802.1Q / 802.1ad VLAN tags
//! (IEEE 802.1Q-2018 section 9.6). A tag is 4 bytes inserted before the EtherType: the TPID
//! (0x8100 C-tag, 0x88a8 S-tag, and the pre-standard 0x9100 QinQ TPID) then the 16-bit TCI
//! (PCP:3, DEI:1, VID:12). Spillway accepts at most two tags (QinQ).

use crate::error::{Layer, WireError};
use crate::field::{be16, set16};
use crate::key::MacAddr;

/// EtherType values (IEEE "EtherType" registry).
pub mod ethertype {
    /// IPv4 (RFC 894).
    pub const IPV4: u16 = 0x0800;
    /// ARP (RFC 826).
    pub const ARP: u16 = 0x0806;
    /// IPv6 (RFC 2464).
    pub const IPV6: u16 = 0x86dd;
    /// 802.1Q customer VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service VLAN tag (QinQ outer tag).
    pub const QINQ: u16 = 0x88a8;
    /// Pre-standard QinQ outer tag used by some switches.
    pub const QINQ_OLD: u16 = 0x9100;
}

/// Length of the untagged Ethernet II header.
pub const HEADER_LEN: usize = 14;
/// Length of one VLAN tag.
pub const VLAN_TAG_LEN: usize = 4;
/// The most VLAN tags a frame may carry (802.1ad QinQ).
pub const VLAN_TAGS_MAX: usize = 2;

/// True for the TPIDs Spillway recognises as a VLAN tag.
#[inline(always)]
pub const fn is_vlan_tpid(t: u16) -> bool {
    matches!(t, ethertype::VLAN | ethertype::QINQ | ethertype::QINQ_OLD)
}

/// A view of an Ethernet II header (destination, source, EtherType/first TPID).
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps `buffer` without checking its length; accessors panic if it is shorter than 14.
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps `buffer`, which must hold at least the 14-byte header.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let len = buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::truncated(Layer::Ethernet, HEADER_LEN, len));
        }
        Ok(EthernetFrame { buffer })
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination address.
    pub fn dst_addr(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]])
    }

    /// Source address.
    pub fn src_addr(&self) -> MacAddr {
        let b = self.buffer.as_ref();
        MacAddr([b[6], b[7], b[8], b[9], b[10], b[11]])
    }

    /// The EtherType field at offset 12 (a TPID when the frame is tagged).
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), 12)
    }

    /// Everything after the 14-byte header (tags included).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a.0);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a.0);
    }

    /// Sets the EtherType / first TPID.
    pub fn set_ethertype(&mut self, t: u16) {
        set16(self.buffer.as_mut(), 12, t);
    }
}

/// The decoded Ethernet header with its tags: what [`EthernetRepr::parse`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Source address.
    pub src: MacAddr,
    /// Destination address.
    pub dst: MacAddr,
    /// TCIs, outermost first; only the first `vlan_count` are meaningful.
    pub vlans: [u16; VLAN_TAGS_MAX],
    /// How many tags the frame carries (0..=2).
    pub vlan_count: u8,
    /// The EtherType after the tags.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Length of the header including tags.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN + VLAN_TAG_LEN * self.vlan_count as usize
    }

    /// Parses the header and up to two tags. Three or more tags give `TooDeep`.
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<EthernetRepr, WireError> {
        let h: &[u8; HEADER_LEN] = buf.first_chunk().ok_or(WireError::truncated(
            Layer::Ethernet,
            HEADER_LEN,
            buf.len(),
        ))?;
        let mut repr = EthernetRepr {
            dst: MacAddr([h[0], h[1], h[2], h[3], h[4], h[5]]),
            src: MacAddr([h[6], h[7], h[8], h[9], h[10], h[11]]),
            vlans: [0; VLAN_TAGS_MAX],
            vlan_count: 0,
            ethertype: u16::from_be_bytes([h[12], h[13]]),
        };
        let mut off = HEADER_LEN;
        while is_vlan_tpid(repr.ethertype) {
            let n = repr.vlan_count as usize;
            if n == VLAN_TAGS_MAX {
                return Err(WireError::too_deep(
                    Layer::Vlan,
                    "vlan tags",
                    VLAN_TAGS_MAX as u32,
                    VLAN_TAGS_MAX as u32 + 1,
                ));
            }
            let t: &[u8; VLAN_TAG_LEN] =
                buf.get(off..)
                    .and_then(|s| s.first_chunk())
                    .ok_or(WireError::truncated(
                        Layer::Vlan,
                        off + VLAN_TAG_LEN,
                        buf.len(),
                    ))?;
            repr.vlans[n] = u16::from_be_bytes([t[0], t[1]]);
            repr.ethertype = u16::from_be_bytes([t[2], t[3]]);
            repr.vlan_count += 1;
            off += VLAN_TAG_LEN;
        }
        Ok(repr)
    }

    /// Writes the header and tags into the front of `buf`; outer tags use TPID 0x88a8 and the
    /// innermost 0x8100 (802.1ad). Returns the bytes written.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.header_len();
        if buf.len() < len {
            return Err(WireError::truncated(Layer::Ethernet, len, buf.len()));
        }
        buf[0..6].copy_from_slice(&self.dst.0);
        buf[6..12].copy_from_slice(&self.src.0);
        let n = self.vlan_count as usize;
        let mut off = 12;
        for (i, tci) in self.vlans[..n.min(VLAN_TAGS_MAX)].iter().enumerate() {
            let tpid = if i + 1 == n {
                ethertype::VLAN
            } else {
                ethertype::QINQ
            };
            set16(buf, off, tpid);
            set16(buf, off + 2, *tci);
            off += 4;
        }
        set16(buf, off, self.ethertype);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qinq_parses_two_tags_outermost_first() {
        let mut f = [0u8; 22];
        f[12..14].copy_from_slice(&[0x88, 0xa8]);
        f[14..16].copy_from_slice(&[0x00, 0x64]);
        f[16..18].copy_from_slice(&[0x81, 0x00]);
        f[18..20].copy_from_slice(&[0x00, 0xc8]);
        f[20..22].copy_from_slice(&[0x08, 0x00]);
        let r = EthernetRepr::parse(&f).expect("valid qinq");
        assert_eq!(
            (r.vlan_count, r.vlans, r.ethertype),
            (2, [100, 200], 0x0800)
        );
        let mut out = [0u8; 22];
        assert_eq!(r.emit(&mut out), Ok(22));
        assert_eq!(out, f);
    }

    #[test]
    fn three_tags_are_too_deep() {
        let mut f = [0u8; 30];
        for off in [12, 16, 20] {
            f[off..off + 2].copy_from_slice(&[0x81, 0x00]);
        }
        let e = EthernetRepr::parse(&f).unwrap_err();
        assert!(matches!(e.kind, crate::ErrorKind::TooDeep(_)));
    }
}
