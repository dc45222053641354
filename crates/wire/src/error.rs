//! The one error type of the wire crate. It is `Copy` so the data path can carry it in a verdict
//! without allocating, and it names the header, the field, what was expected and what was found.

use core::fmt;

/// The header a [`WireError`] is about.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Layer {
    /// Ethernet II header.
    Ethernet,
    /// An 802.1Q / 802.1ad tag.
    Vlan,
    /// ARP.
    Arp,
    /// IPv4 header (RFC 791).
    Ipv4,
    /// IPv6 fixed header (RFC 8200).
    Ipv6,
    /// An IPv6 extension header.
    Ipv6Ext,
    /// TCP header (RFC 9293).
    Tcp,
    /// UDP header (RFC 768).
    Udp,
    /// ICMP (RFC 792).
    Icmp,
    /// ICMPv6 (RFC 4443).
    Icmpv6,
    /// VXLAN header (RFC 7348).
    Vxlan,
    /// The Ethernet frame inside a VXLAN packet.
    Inner,
}

/// What was wrong.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ErrorKind {
    /// The buffer ended before the header did: `expected` bytes needed, `actual` available.
    Truncated,
    /// A field has a value the header cannot have (IHL < 5, version != 4, data offset < 5, ...):
    /// `expected` is the bound or the required value, `actual` the value found.
    BadField(&'static str),
    /// A length field claims more than the buffer holds (IPv4 total length, UDP length, ...).
    LengthMismatch(&'static str),
    /// Too many stacked headers (VLAN tags beyond QinQ, IPv6 extension headers beyond the limit).
    TooDeep(&'static str),
}

/// A malformed packet: which header, what was wrong, expected vs actual.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct WireError {
    /// The header being parsed.
    pub layer: Layer,
    /// What was wrong with it.
    pub kind: ErrorKind,
    /// The required value or bound (bytes for `Truncated`/`LengthMismatch`).
    pub expected: u32,
    /// The value found.
    pub actual: u32,
    /// True when the error is inside the Ethernet frame carried by a VXLAN packet; `Display`
    /// then prefixes "inner frame: ".
    pub inner: bool,
}

impl WireError {
    /// A truncation error: `expected` bytes needed, `actual` available.
    pub const fn truncated(layer: Layer, expected: usize, actual: usize) -> WireError {
        WireError {
            layer,
            kind: ErrorKind::Truncated,
            expected: expected as u32,
            actual: actual as u32,
            inner: false,
        }
    }

    /// A bad field value.
    pub const fn bad_field(
        layer: Layer,
        field: &'static str,
        expected: u32,
        actual: u32,
    ) -> WireError {
        WireError {
            layer,
            kind: ErrorKind::BadField(field),
            expected,
            actual,
            inner: false,
        }
    }

    /// A length field that disagrees with the buffer.
    pub const fn length(
        layer: Layer,
        field: &'static str,
        expected: u32,
        actual: u32,
    ) -> WireError {
        WireError {
            layer,
            kind: ErrorKind::LengthMismatch(field),
            expected,
            actual,
            inner: false,
        }
    }
}

impl WireError {
    /// Too many stacked headers: at most `expected`, `actual` seen.
    pub const fn too_deep(
        layer: Layer,
        what: &'static str,
        expected: u32,
        actual: u32,
    ) -> WireError {
        WireError {
            layer,
            kind: ErrorKind::TooDeep(what),
            expected,
            actual,
            inner: false,
        }
    }

    /// The same error, marked as found inside a VXLAN inner frame.
    pub const fn in_inner(mut self) -> WireError {
        self.inner = true;
        self
    }

    /// True for the two kinds that mean "the bytes ran out" (`Truncated`, `LengthMismatch`).
    pub const fn is_length_error(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Truncated | ErrorKind::LengthMismatch(_)
        )
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layer = match self.layer {
            Layer::Ethernet => "ethernet",
            Layer::Vlan => "vlan",
            Layer::Arp => "arp",
            Layer::Ipv4 => "ipv4",
            Layer::Ipv6 => "ipv6",
            Layer::Ipv6Ext => "ipv6 extension header",
            Layer::Tcp => "tcp",
            Layer::Udp => "udp",
            Layer::Icmp => "icmp",
            Layer::Icmpv6 => "icmpv6",
            Layer::Vxlan => "vxlan",
            Layer::Inner => "inner frame",
        };
        if self.inner {
            f.write_str("inner frame: ")?;
        }
        match self.kind {
            ErrorKind::Truncated => write!(
                f,
                "{layer}: truncated: expected {} bytes, got {}",
                self.expected, self.actual
            ),
            ErrorKind::BadField(field) => write!(
                f,
                "{layer}: bad {field}: expected {}, got {}",
                self.expected, self.actual
            ),
            ErrorKind::LengthMismatch(field) => write!(
                f,
                "{layer}: {field} {} exceeds the {} bytes available",
                self.actual, self.expected
            ),
            ErrorKind::TooDeep(what) => write!(
                f,
                "{layer}: too many {what}: at most {}, got {}",
                self.expected, self.actual
            ),
        }
    }
}

impl core::error::Error for WireError {}
