//! IP prefixes (CIDR blocks) over [`IpAddr16`], keeping IPv4 and IPv6 apart.
//!
//! An IPv4 prefix `a.b.c.d/n` is stored with `len = n` (0..=32) and the IPv4-mapped address; an
//! IPv6 prefix with `len` 0..=128. A prefix only ever contains addresses of its own family, so
//! `::/0` does not contain `10.0.0.1` even though the mapped form starts with zero bytes. IPv6
//! prefixes inside the mapped range `::ffff:0:0/96` are rejected by the parser: write IPv4 prefixes
//! in dotted form.

use core::fmt;
use core::net::{IpAddr, Ipv6Addr};
use spillway_wire::IpAddr16;

/// The address family of an [`IpAddr16`] or [`Prefix`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Family {
    /// IPv4 (stored IPv4-mapped).
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(ip: IpAddr16) -> Family {
        if ip.is_v4() { Family::V4 } else { Family::V6 }
    }

    /// The longest prefix length of the family: 32 or 128.
    pub const fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// The address as a big-endian integer in its family's width: the low 32 bits for IPv4.
pub(crate) fn addr_bits(ip: IpAddr16) -> u128 {
    match ip.v4_octets() {
        Some(o) => u128::from(u32::from_be_bytes(o)),
        None => u128::from_be_bytes(ip.0),
    }
}

/// A CIDR block. The address has no bits set past `len` (the parser normalises host bits away).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    family: Family,
    /// Network bits in the family's width, host bits zero.
    bits: u128,
    len: u8,
}

impl Prefix {
    /// A prefix of `len` bits of `ip`; host bits are cleared. `None` when `len` exceeds the
    /// family's width or `ip` is an IPv6 address inside the mapped range.
    pub fn new(ip: IpAddr16, len: u8) -> Option<Prefix> {
        let family = Family::of(ip);
        if len > family.bits() {
            return None;
        }
        Some(Prefix {
            family,
            bits: addr_bits(ip) & mask(family, len),
            len,
        })
    }

    /// The family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// True for `/0`.
    pub fn is_default(&self) -> bool {
        self.len == 0
    }

    /// The network address (host bits zero).
    pub fn network(&self) -> IpAddr16 {
        match self.family {
            Family::V4 => IpAddr16::from_v4((self.bits as u32).to_be_bytes()),
            Family::V6 => IpAddr16::from_v6(self.bits.to_be_bytes()),
        }
    }

    /// First and last address as integers in the family's width (see [`addr_bits`]).
    pub(crate) fn range(&self) -> (u128, u128) {
        let host = !mask(self.family, self.len) & width_max(self.family);
        (self.bits, self.bits | host)
    }

    /// True when `ip` is of this prefix's family and inside it.
    pub fn contains(&self, ip: IpAddr16) -> bool {
        Family::of(ip) == self.family && addr_bits(ip) & mask(self.family, self.len) == self.bits
    }

    /// True when every address of `other` is in `self`.
    pub fn covers(&self, other: &Prefix) -> bool {
        self.family == other.family
            && self.len <= other.len
            && other.bits & mask(self.family, self.len) == self.bits
    }
}

/// All-ones in the family's width.
pub(crate) fn width_max(family: Family) -> u128 {
    match family {
        Family::V4 => u128::from(u32::MAX),
        Family::V6 => u128::MAX,
    }
}

fn mask(family: Family, len: u8) -> u128 {
    let w = u32::from(family.bits());
    let len = u32::from(len);
    if len == 0 {
        0
    } else {
        // len in 1..=w: the top `len` bits of a `w`-bit word.
        (u128::MAX << (128 - len)) >> (128 - w)
    }
}

/// Why a prefix string did not parse.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PrefixParseError {
    /// Not `address/length` with a valid address.
    Syntax,
    /// The length is not a number or is longer than the family's width.
    Length,
    /// An IPv6 prefix inside `::ffff:0:0/96`.
    MappedV6,
}

impl core::str::FromStr for Prefix {
    type Err = PrefixParseError;

    fn from_str(s: &str) -> Result<Prefix, PrefixParseError> {
        let (addr, len) = s.split_once('/').ok_or(PrefixParseError::Syntax)?;
        let ip: IpAddr = addr.parse().map_err(|_| PrefixParseError::Syntax)?;
        let len: u8 = len.parse().map_err(|_| PrefixParseError::Length)?;
        if let IpAddr::V6(v6) = ip {
            let inside_mapped = len >= 96 && is_mapped(v6);
            if inside_mapped {
                return Err(PrefixParseError::MappedV6);
            }
        }
        Prefix::new(IpAddr16::from(ip), len).ok_or(PrefixParseError::Length)
    }
}

fn is_mapped(v6: Ipv6Addr) -> bool {
    v6.to_ipv4_mapped().is_some()
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network(), self.len)
    }
}

impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Prefix {
        s.parse().expect("test prefix parses")
    }

    fn ip(s: &str) -> IpAddr16 {
        s.parse().expect("test address parses")
    }

    #[test]
    fn host_bits_are_normalised() {
        assert_eq!(p("10.1.2.3/16"), p("10.1.0.0/16"));
        assert_eq!(p("10.1.2.3/16").to_string(), "10.1.0.0/16");
        assert_eq!(p("fd00:1::5/64").to_string(), "fd00:1::/64");
    }

    #[test]
    fn families_never_mix() {
        assert!(!p("::/0").contains(ip("10.0.0.1")));
        assert!(!p("0.0.0.0/0").contains(ip("fd00::1")));
        assert!(p("0.0.0.0/0").contains(ip("10.0.0.1")));
        assert!(p("::/0").contains(ip("fd00::1")));
    }

    #[test]
    fn bad_prefixes_are_rejected() {
        assert_eq!("10.0.0.0".parse::<Prefix>(), Err(PrefixParseError::Syntax));
        assert_eq!(
            "10.0.0.0/33".parse::<Prefix>(),
            Err(PrefixParseError::Length)
        );
        assert_eq!("::/129".parse::<Prefix>(), Err(PrefixParseError::Length));
        assert_eq!("zz/8".parse::<Prefix>(), Err(PrefixParseError::Syntax));
        assert_eq!(
            "::ffff:10.0.0.0/104".parse::<Prefix>(),
            Err(PrefixParseError::MappedV6)
        );
    }

    #[test]
    fn ranges_cover_the_whole_block() {
        assert_eq!(p("0.0.0.0/0").range(), (0, u128::from(u32::MAX)));
        assert_eq!(p("10.0.0.1/32").range(), (0x0a00_0001, 0x0a00_0001));
        assert_eq!(p("::/0").range(), (0, u128::MAX));
        assert!(p("10.0.0.0/8").covers(&p("10.1.0.0/16")));
        assert!(!p("10.1.0.0/16").covers(&p("10.0.0.0/8")));
    }
}
