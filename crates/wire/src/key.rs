//! Identifiers shared by every layer above the wire: MAC addresses, VXLAN network identifiers,
//! IP addresses in one fixed-size form, and the 5-tuple [`FlowKey`].

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::icmp;

/// A 48-bit IEEE 802 MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// 00:00:00:00:00:00.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// True for group (multicast and broadcast) addresses: the I/G bit of the first octet.
    pub fn is_multicast(self) -> bool {
        self.0[0] & 1 == 1
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl core::str::FromStr for MacAddr {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let p = parts.next().ok_or(())?;
            if p.len() != 2 {
                return Err(());
            }
            *byte = u8::from_str_radix(p, 16).map_err(|_| ())?;
        }
        if parts.next().is_some() {
            return Err(());
        }
        Ok(MacAddr(out))
    }
}

/// A 24-bit VXLAN network identifier (RFC 7348 section 5). The constructor enforces the range.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct Vni(u32);

impl Vni {
    /// Largest valid VNI, 2^24 - 1.
    pub const MAX: u32 = 0x00ff_ffff;

    /// `None` when `v` does not fit in 24 bits.
    pub const fn new(v: u32) -> Option<Vni> {
        if v <= Self::MAX { Some(Vni(v)) } else { None }
    }

    /// The numeric value, always `<= Vni::MAX`.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Vni {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An IPv4 or IPv6 address in one 16-byte form. IPv4 is stored IPv4-mapped (`::ffff:a.b.c.d`,
/// RFC 4291 section 2.5.5.2), so one fixed-size, `Copy`, cheaply hashed key covers both families.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct IpAddr16(pub [u8; 16]);

impl IpAddr16 {
    /// The unspecified address `::`.
    pub const UNSPECIFIED: IpAddr16 = IpAddr16([0; 16]);

    /// An IPv4 address in mapped form.
    pub const fn from_v4(octets: [u8; 4]) -> IpAddr16 {
        let o = octets;
        IpAddr16([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, o[0], o[1], o[2], o[3],
        ])
    }

    /// An IPv6 address.
    pub const fn from_v6(octets: [u8; 16]) -> IpAddr16 {
        IpAddr16(octets)
    }

    /// True when this holds an IPv4-mapped address.
    pub fn is_v4(&self) -> bool {
        self.0[..10] == [0; 10] && self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// The IPv4 octets, when this is an IPv4-mapped address.
    pub fn v4_octets(&self) -> Option<[u8; 4]> {
        self.is_v4()
            .then(|| [self.0[12], self.0[13], self.0[14], self.0[15]])
    }

    /// The standard-library form.
    pub fn to_std(&self) -> IpAddr {
        match self.v4_octets() {
            Some(o) => IpAddr::V4(Ipv4Addr::from(o)),
            None => IpAddr::V6(Ipv6Addr::from(self.0)),
        }
    }
}

impl core::str::FromStr for IpAddr16 {
    type Err = core::net::AddrParseError;

    /// Parses an IPv4 or IPv6 address in its usual text form; IPv4 becomes IPv4-mapped.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<IpAddr>().map(IpAddr16::from)
    }
}

impl From<IpAddr> for IpAddr16 {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => IpAddr16::from_v4(v4.octets()),
            IpAddr::V6(v6) => IpAddr16::from_v6(v6.octets()),
        }
    }
}

impl From<Ipv4Addr> for IpAddr16 {
    fn from(ip: Ipv4Addr) -> Self {
        IpAddr16::from_v4(ip.octets())
    }
}

impl From<Ipv6Addr> for IpAddr16 {
    fn from(ip: Ipv6Addr) -> Self {
        IpAddr16::from_v6(ip.octets())
    }
}

impl fmt::Debug for IpAddr16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_std(), f)
    }
}

impl fmt::Display for IpAddr16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_std(), f)
    }
}

/// IP protocol numbers used by Spillway (IANA "Assigned Internet Protocol Numbers").
pub mod ip_proto {
    /// ICMP for IPv4 (RFC 792).
    pub const ICMP: u8 = 1;
    /// TCP (RFC 9293).
    pub const TCP: u8 = 6;
    /// UDP (RFC 768).
    pub const UDP: u8 = 17;
    /// ICMP for IPv6 (RFC 4443).
    pub const ICMPV6: u8 = 58;
    /// IPv6 hop-by-hop options (RFC 8200 section 4.3).
    pub const HOPOPT: u8 = 0;
    /// IPv6 routing header (RFC 8200 section 4.4).
    pub const IPV6_ROUTE: u8 = 43;
    /// IPv6 fragment header (RFC 8200 section 4.5).
    pub const IPV6_FRAG: u8 = 44;
    /// IPv6 destination options (RFC 8200 section 4.6).
    pub const IPV6_OPTS: u8 = 60;
    /// IPv6 "no next header" (RFC 8200 section 4.7).
    pub const IPV6_NONXT: u8 = 59;
}

/// The transport 5-tuple of one direction of a flow, as seen on the wire.
///
/// For TCP and UDP the ports are the transport ports. ICMP (over IPv4) and ICMPv6 (over IPv6)
/// follow Linux `nf_conntrack`'s tuple: `dst_port` is `type << 8 | code` for every message, and
/// `src_port` is the identifier for queries and their replies ([`crate::icmp::is_query`]) and 0
/// otherwise. So an echo request and an echo reply with the same identifier have different keys
/// (a reply cannot match a request's state, nor a request a reply's), and
/// [`FlowKey::reversed`] of a request is the key of its reply. Query types and other types never
/// share a `dst_port`, since the type is in its high byte. Non-first fragments and other
/// protocols carry zero ports. Equality, hashing and ordering are over all fields.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct FlowKey {
    /// Source address.
    pub src_ip: IpAddr16,
    /// Destination address.
    pub dst_ip: IpAddr16,
    /// Source port (see the type's doc for ICMP).
    pub src_port: u16,
    /// Destination port (see the type's doc for ICMP).
    pub dst_port: u16,
    /// IP protocol number ([`ip_proto`]).
    pub proto: u8,
}

impl FlowKey {
    /// The key of the other direction of the same flow. For an ICMP query or reply that is the
    /// key of its counterpart (same identifier and code, the answering or requesting type, as
    /// `nf_conntrack`'s `invert_tuple`); other ICMP messages have no other direction, so only the
    /// addresses swap. Either way `k.reversed().reversed() == k`.
    #[inline]
    pub fn reversed(&self) -> FlowKey {
        let (src_port, dst_port) = match self.icmp_type() {
            None => (self.dst_port, self.src_port),
            Some((v6, t)) => match icmp::counterpart(v6, t) {
                Some(c) => (self.src_port, u16::from(c) << 8 | (self.dst_port & 0xff)),
                None => (self.src_port, self.dst_port),
            },
        };
        FlowKey {
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port,
            dst_port,
            proto: self.proto,
        }
    }

    /// For ICMP over IPv4 and ICMPv6 over IPv6: `(is IPv6, message type)`. `None` for other
    /// protocols, and for protocol 1 over IPv6 or 58 over IPv4, which the parser treats as opaque.
    #[inline]
    pub fn icmp_type(&self) -> Option<(bool, u8)> {
        let v6 = match self.proto {
            ip_proto::ICMP => false,
            ip_proto::ICMPV6 => true,
            _ => return None,
        };
        (self.src_ip.is_v4() != v6).then_some((v6, (self.dst_port >> 8) as u8))
    }

    /// What the message is to connection tracking, for ICMP and ICMPv6 keys ([`FlowKey::icmp_type`]).
    #[inline]
    pub fn icmp_kind(&self) -> Option<icmp::IcmpKind> {
        self.icmp_type().map(|(v6, t)| icmp::kind(v6, t))
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}:{} -> {}:{}",
            self.proto, self.src_ip, self.src_port, self.dst_ip, self.dst_port
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_from_text_with_ipv4_mapped() {
        let v4: IpAddr16 = "10.1.2.3".parse().unwrap();
        assert_eq!(v4, IpAddr16::from_v4([10, 1, 2, 3]));
        assert!(v4.is_v4());
        let v6: IpAddr16 = "fd00::1".parse().unwrap();
        assert!(!v6.is_v4());
        assert_eq!(v6.to_string(), "fd00::1");
        assert!("10.1.2".parse::<IpAddr16>().is_err());
    }

    fn icmp_key(v6: bool, msg_type: u8, code: u8, id: u16) -> FlowKey {
        let (src_ip, dst_ip, proto) = if v6 {
            (
                "fd00::1".parse().unwrap(),
                "fd00::2".parse().unwrap(),
                ip_proto::ICMPV6,
            )
        } else {
            (
                "10.0.0.1".parse().unwrap(),
                "10.0.0.2".parse().unwrap(),
                ip_proto::ICMP,
            )
        };
        FlowKey {
            src_ip,
            dst_ip,
            src_port: id,
            dst_port: u16::from(msg_type) << 8 | u16::from(code),
            proto,
        }
    }

    #[test]
    fn reversed_icmp_request_is_its_reply_and_back() {
        let req = icmp_key(false, icmp::V4_ECHO_REQUEST, 0, 77);
        let rep = req.reversed();
        assert_eq!((rep.src_ip, rep.dst_ip), (req.dst_ip, req.src_ip));
        assert_eq!((rep.src_port, rep.dst_port), (77, 0x0000));
        assert_eq!(rep.reversed(), req);
        let ts = icmp_key(false, 13, 0, 5).reversed();
        assert_eq!((ts.src_port, ts.dst_port), (5, 14 << 8));
        let req6 = icmp_key(true, icmp::V6_ECHO_REQUEST, 0, 9);
        assert_eq!(
            req6.reversed().dst_port,
            u16::from(icmp::V6_ECHO_REPLY) << 8
        );
        assert_eq!(req6.icmp_kind(), Some(icmp::IcmpKind::Request));
        assert_eq!(req6.reversed().icmp_kind(), Some(icmp::IcmpKind::Reply));
        // An error has no other direction: only the addresses swap.
        let err = icmp_key(true, icmp::V6_PACKET_TOO_BIG, 0, 0);
        assert_eq!(
            (err.reversed().src_port, err.reversed().dst_port),
            (0, 0x0200)
        );
        assert_eq!(err.reversed().reversed(), err);
        // A request from the other side with the same identifier is not the reply.
        let mut back = req;
        core::mem::swap(&mut back.src_ip, &mut back.dst_ip);
        assert_ne!(back, rep);
        // Protocol 1 over IPv6 is not ICMP.
        let mut odd = req6;
        odd.proto = ip_proto::ICMP;
        assert_eq!(odd.icmp_kind(), None);
    }
}
