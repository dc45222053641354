//! Identifiers shared by every layer above the wire: MAC addresses, VXLAN network identifiers,
//! IP addresses in one fixed-size form, and the 5-tuple [`FlowKey`].

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

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
/// For TCP and UDP the ports are the transport ports. For ICMP/ICMPv6 echo request/reply the
/// identifier goes in `src_port` and `dst_port` both (so the reversed key of a request is the key
/// of its reply) and other ICMP types use `(type << 8 | code, 0)`. Non-first fragments and other
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
    /// The key of the other direction of the same flow.
    pub fn reversed(&self) -> FlowKey {
        FlowKey {
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.dst_port,
            dst_port: self.src_port,
            proto: self.proto,
        }
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
}
