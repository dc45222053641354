//! IPv6 Neighbor Discovery (RFC 4861) and Multicast Listener Discovery (RFC 2710, RFC 3810):
//! which ICMPv6 types they are, the Neighbor Solicitation / Advertisement message with its
//! link-layer address options, and the addresses ND is sent to.
//!
//! NS and NA share one layout (RFC 4861 sections 4.3 and 4.4): the 4-byte ICMPv6 header, 4
//! bytes of flags (NA) or reserved (NS), the 16-byte target address, then options. Options are
//! type, length in units of 8 bytes, data (section 4.6); a length of 0 makes the whole message
//! invalid (sections 7.1.1, 7.1.2). The source (type 1) and target (type 2) link-layer address
//! options carry a 6-byte MAC on Ethernet (RFC 2464 section 6).
//!
//! [`NeighborRepr::parse`] checks what RFC 4861 section 7.1 asks of the message itself (code 0,
//! at least 24 bytes, a unicast target, well-formed options, the solicited flag on multicast
//! advertisements); the checksum and the IP hop limit of 255 are the caller's to check, since
//! they need the IP header ([`crate::checksum::verify_l4_v6`]).

use crate::error::{Layer, WireError};
use crate::field::{be32, set16, set32};
use crate::key::MacAddr;

/// MLD query (RFC 2710 section 3.6; RFC 3810 section 5.1).
pub const MLD_QUERY: u8 = 130;
/// MLDv1 report (RFC 2710 section 3.7).
pub const MLD_REPORT_V1: u8 = 131;
/// MLDv1 done (RFC 2710 section 3.8).
pub const MLD_DONE: u8 = 132;
/// Router Solicitation (RFC 4861 section 4.1).
pub const ROUTER_SOLICIT: u8 = 133;
/// Router Advertisement (RFC 4861 section 4.2).
pub const ROUTER_ADVERT: u8 = 134;
/// Neighbor Solicitation (RFC 4861 section 4.3).
pub const NEIGHBOR_SOLICIT: u8 = 135;
/// Neighbor Advertisement (RFC 4861 section 4.4).
pub const NEIGHBOR_ADVERT: u8 = 136;
/// Redirect (RFC 4861 section 4.5).
pub const REDIRECT: u8 = 137;
/// MLDv2 report (RFC 3810 section 5.2).
pub const MLD_REPORT_V2: u8 = 143;

/// Length of an NS or NA without options.
pub const NEIGHBOR_LEN: usize = 24;
/// Length of a link-layer address option on Ethernet.
pub const LLA_OPTION_LEN: usize = 8;
/// Option type: source link-layer address (RFC 4861 section 4.6.1).
pub const OPT_SOURCE_LLA: u8 = 1;
/// Option type: target link-layer address (RFC 4861 section 4.6.1).
pub const OPT_TARGET_LLA: u8 = 2;
/// The hop limit every ND message is sent with, and the only one a receiver accepts (RFC 4861
/// sections 6.1.1, 6.1.2, 7.1.1, 7.1.2, 8.1): a packet that crossed a router cannot have it.
pub const HOP_LIMIT: u8 = 255;

/// NA flag: the sender is a router (RFC 4861 section 4.4).
pub const FLAG_ROUTER: u32 = 0x8000_0000;
/// NA flag: sent in response to a solicitation.
pub const FLAG_SOLICITED: u32 = 0x4000_0000;
/// NA flag: override an existing cache entry.
pub const FLAG_OVERRIDE: u32 = 0x2000_0000;

/// The all-nodes multicast address `ff02::1` (RFC 4291 section 2.7.1).
pub const ALL_NODES: [u8; 16] = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// What an ICMPv6 message is to a neighbour-discovery responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdKind {
    /// Router Solicitation.
    RouterSolicit,
    /// Router Advertisement.
    RouterAdvert,
    /// Neighbor Solicitation.
    NeighborSolicit,
    /// Neighbor Advertisement.
    NeighborAdvert,
    /// Redirect.
    Redirect,
    /// An MLD query, report (v1 or v2) or done.
    Mld,
}

/// The ND or MLD kind of ICMPv6 type `msg_type`; `None` for every other type.
pub const fn kind(msg_type: u8) -> Option<NdKind> {
    Some(match msg_type {
        ROUTER_SOLICIT => NdKind::RouterSolicit,
        ROUTER_ADVERT => NdKind::RouterAdvert,
        NEIGHBOR_SOLICIT => NdKind::NeighborSolicit,
        NEIGHBOR_ADVERT => NdKind::NeighborAdvert,
        REDIRECT => NdKind::Redirect,
        MLD_QUERY | MLD_REPORT_V1 | MLD_DONE | MLD_REPORT_V2 => NdKind::Mld,
        _ => return None,
    })
}

/// True for IPv6 multicast addresses, `ff00::/8` (RFC 4291 section 2.7).
pub const fn is_multicast(a: &[u8; 16]) -> bool {
    a[0] == 0xff
}

/// True for link-local unicast addresses, `fe80::/10` (RFC 4291 section 2.5.6).
pub const fn is_link_local(a: &[u8; 16]) -> bool {
    a[0] == 0xfe && a[1] & 0xc0 == 0x80
}

/// The solicited-node multicast address of `a`: `ff02::1:ff00:0/104` with the low 24 bits of
/// `a` (RFC 4291 section 2.7.1), where an NS for `a` is sent when its owner is unknown.
pub const fn solicited_node(a: &[u8; 16]) -> [u8; 16] {
    [
        0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, a[13], a[14], a[15],
    ]
}

/// The Ethernet address an IPv6 multicast address maps to: `33:33` and its low 32 bits
/// (RFC 2464 section 7).
pub const fn multicast_mac(a: &[u8; 16]) -> MacAddr {
    MacAddr([0x33, 0x33, a[12], a[13], a[14], a[15]])
}

/// The link-local address a host with `mac` forms from its modified EUI-64 interface id
/// (RFC 4291 section 2.5.6 and appendix A; RFC 4862 section 5.3): `fe80::` with the MAC split
/// by `ff:fe` and the universal/local bit inverted.
pub const fn link_local_of(mac: MacAddr) -> [u8; 16] {
    let m = mac.0;
    [
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ]
}

/// Neighbor Solicitation or Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighborOp {
    /// Neighbor Solicitation: "what is the link-layer address of `target`?"
    Solicit,
    /// Neighbor Advertisement: "`target` is at `lla`".
    Advert,
}

/// A decoded NS or NA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborRepr {
    /// Which of the two.
    pub op: NeighborOp,
    /// NA flags ([`FLAG_ROUTER`], [`FLAG_SOLICITED`], [`FLAG_OVERRIDE`]); 0 for an NS (whose
    /// reserved field receivers ignore, RFC 4861 section 4.3).
    pub flags: u32,
    /// The target address.
    pub target: [u8; 16],
    /// The link-layer address option of the message's direction: the source's for an NS
    /// (type 1), the target's for an NA (type 2); options of other types are skipped.
    pub lla: Option<MacAddr>,
}

impl NeighborRepr {
    /// Parses an NS or NA (`msg` is the ICMPv6 message, from its type byte to the end of the
    /// IPv6 payload) and checks RFC 4861 section 7.1.1 / 7.1.2 as far as the message goes:
    /// type 135 or 136, code 0, at least 24 bytes, a target that is not multicast, options
    /// that have a non-zero length and fit, a link-layer address option of 8 bytes.
    pub fn parse(msg: &[u8]) -> Result<NeighborRepr, WireError> {
        let bad =
            |field, want: u32, got: u32| WireError::bad_field(Layer::Icmpv6, field, want, got);
        let h: &[u8; NEIGHBOR_LEN] = msg.first_chunk().ok_or(WireError::truncated(
            Layer::Icmpv6,
            NEIGHBOR_LEN,
            msg.len(),
        ))?;
        let op = match h[0] {
            NEIGHBOR_SOLICIT => NeighborOp::Solicit,
            NEIGHBOR_ADVERT => NeighborOp::Advert,
            t => return Err(bad("type", u32::from(NEIGHBOR_SOLICIT), u32::from(t))),
        };
        if h[1] != 0 {
            return Err(bad("code", 0, u32::from(h[1])));
        }
        let mut target = [0u8; 16];
        target.copy_from_slice(&h[8..24]);
        if is_multicast(&target) {
            return Err(bad("target", 0, u32::from(target[0])));
        }
        let flags = match op {
            NeighborOp::Solicit => 0,
            NeighborOp::Advert => be32(msg, 4),
        };
        let want = match op {
            NeighborOp::Solicit => OPT_SOURCE_LLA,
            NeighborOp::Advert => OPT_TARGET_LLA,
        };
        let mut lla = None;
        let mut off = NEIGHBOR_LEN;
        while off < msg.len() {
            let o: &[u8; 2] = msg[off..].first_chunk().ok_or(WireError::truncated(
                Layer::Icmpv6,
                off + 2,
                msg.len(),
            ))?;
            let len = usize::from(o[1]) * 8;
            if len == 0 {
                return Err(bad("option length", 1, 0));
            }
            let data = msg.get(off..off + len).ok_or(WireError::truncated(
                Layer::Icmpv6,
                off + len,
                msg.len(),
            ))?;
            if o[0] == want {
                if len != LLA_OPTION_LEN {
                    return Err(bad("link-layer address option length", 1, u32::from(o[1])));
                }
                lla = Some(MacAddr([
                    data[2], data[3], data[4], data[5], data[6], data[7],
                ]));
            }
            off += len;
        }
        Ok(NeighborRepr {
            op,
            flags,
            target,
            lla,
        })
    }

    /// Bytes [`NeighborRepr::emit`] writes: 24, plus 8 with a link-layer address option.
    pub const fn buffer_len(&self) -> usize {
        match self.lla {
            Some(_) => NEIGHBOR_LEN + LLA_OPTION_LEN,
            None => NEIGHBOR_LEN,
        }
    }

    /// Writes the message into the front of `buf` with its checksum over the IPv6 pseudo
    /// header of `src` and `dst` (RFC 4443 section 2.3); returns its length.
    pub fn emit(&self, src: &[u8; 16], dst: &[u8; 16], buf: &mut [u8]) -> Result<usize, WireError> {
        let n = self.buffer_len();
        let have = buf.len();
        let out = buf
            .get_mut(..n)
            .ok_or(WireError::truncated(Layer::Icmpv6, n, have))?;
        let (msg_type, opt_type, flags) = match self.op {
            NeighborOp::Solicit => (NEIGHBOR_SOLICIT, OPT_SOURCE_LLA, 0),
            NeighborOp::Advert => (NEIGHBOR_ADVERT, OPT_TARGET_LLA, self.flags),
        };
        out[0] = msg_type;
        out[1] = 0;
        set16(out, 2, 0);
        set32(out, 4, flags);
        out[8..24].copy_from_slice(&self.target);
        if let Some(mac) = self.lla {
            out[24] = opt_type;
            out[25] = 1;
            out[26..32].copy_from_slice(&mac.0);
        }
        let c = crate::checksum::l4_checksum_v6(src, dst, crate::ip_proto::ICMPV6, out);
        set16(out, 2, c);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_derive_as_rfc_4291_says() {
        let mac = MacAddr([0x02, 0, 0, 0, 0x01, 0x01]);
        let ll: core::net::Ipv6Addr = link_local_of(mac).into();
        assert_eq!(ll.to_string(), "fe80::ff:fe00:101");
        let a: core::net::Ipv6Addr = "fd00:1::10".parse().unwrap();
        let sn: core::net::Ipv6Addr = solicited_node(&a.octets()).into();
        assert_eq!(sn.to_string(), "ff02::1:ff00:10");
        assert_eq!(multicast_mac(&sn.octets()).to_string(), "33:33:ff:00:00:10");
        assert!(is_link_local(&ll.octets()) && !is_link_local(&a.octets()));
        assert!(is_multicast(&ALL_NODES));
    }

    #[test]
    fn kinds_cover_nd_and_mld_only() {
        assert_eq!(kind(135), Some(NdKind::NeighborSolicit));
        assert_eq!(kind(143), Some(NdKind::Mld));
        assert_eq!(kind(128), None);
        assert_eq!(kind(1), None);
        assert_eq!(kind(141), None);
    }

    #[test]
    fn options_with_zero_length_or_overrunning_are_rejected() {
        let mut m = [0u8; 32];
        m[0] = NEIGHBOR_SOLICIT;
        m[8] = 0xfd;
        m[24] = OPT_SOURCE_LLA;
        m[25] = 0;
        assert!(NeighborRepr::parse(&m).is_err());
        m[25] = 2;
        assert!(NeighborRepr::parse(&m).is_err());
        m[25] = 1;
        assert!(NeighborRepr::parse(&m).is_ok());
        // An unknown option is skipped; a one-byte tail is not an option.
        m[24] = 14;
        assert_eq!(NeighborRepr::parse(&m).unwrap().lla, None);
        assert!(NeighborRepr::parse(&m[..25]).is_err());
        assert!(NeighborRepr::parse(&m[..23]).is_err());
    }
}
