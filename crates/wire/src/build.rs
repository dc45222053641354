//! Frame construction for tests, benches, example captures and encap templates.
//!
//! [`FrameBuilder`] assembles Ethernet (0..n VLAN tags) / IPv4 or IPv6 (with options or
//! extension headers) / TCP, UDP, ICMP(v6) echo or a raw protocol / payload, and fills every
//! length and checksum. It does not fragment: a fragment offset or MF flag is written as
//! configured, and the transport header is still emitted, with a checksum computed over this
//! packet alone, so a "non-first fragment" built here carries bytes that merely look like a
//! transport header (which the parser must ignore).
//!
//! [`VxlanOuter`] describes a VXLAN underlay (RFC 7348 section 5); [`vxlan_encap`] wraps a frame
//! and [`VxlanOuter::write_header`] writes just the outer headers into a slice, the shape the
//! vSwitch uses for prebuilt encap templates.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::error::{Layer, WireError};
use crate::ethernet::{ethertype, is_vlan_tpid};
use crate::key::{MacAddr, Vni, ip_proto};
use crate::{icmp, vxlan};

/// One IPv6 extension header for [`FrameBuilder::ipv6_ext`]. Option and routing data is padded
/// with zero bytes (Pad1 options, RFC 8200 section 4.2) to a multiple of 8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ipv6Ext {
    /// Hop-by-hop options (must be first to be valid) with the given option bytes.
    HopByHop(Vec<u8>),
    /// Destination options with the given option bytes.
    DestOpts(Vec<u8>),
    /// Routing header: type, segments left, type-specific data.
    Routing {
        /// Routing type.
        routing_type: u8,
        /// Segments left.
        segments_left: u8,
        /// Type-specific data (after the 4 fixed bytes).
        data: Vec<u8>,
    },
    /// Fragment header: offset in 8-byte units, M flag, identification.
    Fragment {
        /// Offset in 8-byte units (13 bits).
        offset: u16,
        /// More fragments.
        more: bool,
        /// Identification.
        ident: u32,
    },
    /// An authentication header (RFC 4302), 24 bytes with a zero SPI and ICV. The parser ends
    /// the walk here (ports 0); ESP and No Next Header are expressed with [`FrameBuilder::raw`].
    Ah,
}

impl Ipv6Ext {
    fn proto(&self) -> u8 {
        match self {
            Ipv6Ext::HopByHop(_) => ip_proto::HOPOPT,
            Ipv6Ext::DestOpts(_) => ip_proto::IPV6_OPTS,
            Ipv6Ext::Routing { .. } => ip_proto::IPV6_ROUTE,
            Ipv6Ext::Fragment { .. } => ip_proto::IPV6_FRAG,
            Ipv6Ext::Ah => crate::ipv6::PROTO_AH,
        }
    }

    fn emit(&self, next: u8, out: &mut Vec<u8>) {
        let start = out.len();
        match self {
            Ipv6Ext::HopByHop(opts) | Ipv6Ext::DestOpts(opts) => {
                out.extend_from_slice(&[next, 0]);
                out.extend_from_slice(opts);
            }
            Ipv6Ext::Routing {
                routing_type,
                segments_left,
                data,
            } => {
                out.extend_from_slice(&[next, 0, *routing_type, *segments_left]);
                out.extend_from_slice(data);
            }
            Ipv6Ext::Fragment {
                offset,
                more,
                ident,
            } => {
                out.extend_from_slice(&[next, 0]);
                out.extend_from_slice(&(((offset & 0x1fff) << 3) | *more as u16).to_be_bytes());
                out.extend_from_slice(&ident.to_be_bytes());
                return;
            }
            Ipv6Ext::Ah => {
                // AH: next, payload len in 4-byte units minus 2 (4 => 24 bytes), reserved, SPI,
                // sequence, 12 bytes of ICV.
                out.extend_from_slice(&[next, 4, 0, 0]);
                out.extend_from_slice(&[0; 20]);
                return;
            }
        }
        let len = (out.len() - start).max(8).div_ceil(8) * 8;
        out.resize(start + len, 0);
        out[start + 1] = (len / 8 - 1) as u8;
    }
}

#[derive(Debug, Clone)]
enum L3Spec {
    None(u16),
    Arp {
        operation: u16,
        sender_ip: [u8; 4],
        target_mac: MacAddr,
        target_ip: [u8; 4],
    },
    V4 {
        src: [u8; 4],
        dst: [u8; 4],
        options: Vec<u8>,
    },
    V6 {
        src: [u8; 16],
        dst: [u8; 16],
        ext: Vec<Ipv6Ext>,
    },
}

#[derive(Debug, Clone, Copy)]
enum L4Spec {
    None,
    Tcp {
        src: u16,
        dst: u16,
        flags: u8,
        seq: u32,
        ack: u32,
        window: u16,
    },
    Udp {
        src: u16,
        dst: u16,
    },
    Echo {
        ident: u16,
        seq: u16,
        reply: bool,
    },
    IcmpRaw {
        msg_type: u8,
        code: u8,
    },
    Raw(u8),
}

/// Builds a complete frame with correct lengths and checksums. Chain setters, then [`build`].
///
/// ```
/// use spillway_wire::build::FrameBuilder;
/// let frame = FrameBuilder::new()
///     .vlan(100)
///     .ipv4([10, 0, 0, 1], [10, 0, 0, 2])
///     .tcp(40000, 80)
///     .payload(b"GET /")
///     .build();
/// assert_eq!(frame.len(), 14 + 4 + 20 + 20 + 5);
/// ```
///
/// Defaults: MACs 02:00:00:00:00:01 -> 02:00:00:00:00:02, no tags, TTL/hop limit 64, TCP flags
/// ACK, window 65535; no L3 means EtherType 0x88b5 (local experimental) with the payload.
///
/// [`build`]: FrameBuilder::build
#[derive(Debug, Clone)]
pub struct FrameBuilder {
    src_mac: MacAddr,
    dst_mac: MacAddr,
    vlans: Vec<(Option<u16>, u16)>,
    l3: L3Spec,
    ttl: u8,
    ident: u16,
    frag_offset: u16,
    more_frags: bool,
    dont_frag: bool,
    tos: u8,
    flow_label: u32,
    l4: L4Spec,
    payload: Vec<u8>,
}

impl Default for FrameBuilder {
    fn default() -> Self {
        FrameBuilder::new()
    }
}

impl FrameBuilder {
    /// A builder with the defaults above.
    pub fn new() -> FrameBuilder {
        FrameBuilder {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlans: Vec::new(),
            l3: L3Spec::None(0x88b5),
            ttl: 64,
            ident: 0,
            frag_offset: 0,
            more_frags: false,
            dont_frag: false,
            tos: 0,
            flow_label: 0,
            l4: L4Spec::None,
            payload: Vec::new(),
        }
    }

    /// Sets the Ethernet source and destination.
    pub fn eth(mut self, src: MacAddr, dst: MacAddr) -> Self {
        self.src_mac = src;
        self.dst_mac = dst;
        self
    }

    /// Adds a VLAN tag (call order is outermost first). With one tag the TPID is 0x8100; with
    /// more, outer tags get 0x88a8 and the innermost 0x8100.
    pub fn vlan(mut self, tci: u16) -> Self {
        self.vlans.push((None, tci));
        self
    }

    /// Adds a VLAN tag with an explicit TPID (e.g. 0x9100).
    pub fn vlan_tpid(mut self, tpid: u16, tci: u16) -> Self {
        self.vlans.push((Some(tpid), tci));
        self
    }

    /// A frame with this EtherType and no IP layer (the payload follows the Ethernet header).
    pub fn ethertype(mut self, ethertype: u16) -> Self {
        self.l3 = L3Spec::None(ethertype);
        self
    }

    /// An Ethernet/IPv4 ARP packet; the sender MAC is the Ethernet source.
    pub fn arp(
        mut self,
        operation: u16,
        sender_ip: [u8; 4],
        target_mac: MacAddr,
        target_ip: [u8; 4],
    ) -> Self {
        self.l3 = L3Spec::Arp {
            operation,
            sender_ip,
            target_mac,
            target_ip,
        };
        self
    }

    /// IPv4 with these addresses.
    pub fn ipv4(mut self, src: impl Into<Ipv4Addr>, dst: impl Into<Ipv4Addr>) -> Self {
        self.l3 = L3Spec::V4 {
            src: src.into().octets(),
            dst: dst.into().octets(),
            options: Vec::new(),
        };
        self
    }

    /// IPv4 options bytes, zero-padded (EOL) to a multiple of 4; at most 40 bytes. Needs
    /// [`ipv4`](Self::ipv4) first.
    pub fn ipv4_options(mut self, opts: &[u8]) -> Self {
        if let L3Spec::V4 { options, .. } = &mut self.l3 {
            options.clear();
            options.extend_from_slice(opts);
            options.resize(opts.len().div_ceil(4) * 4, 0);
            options.truncate(40);
        }
        self
    }

    /// IPv6 with these addresses.
    pub fn ipv6(mut self, src: impl Into<Ipv6Addr>, dst: impl Into<Ipv6Addr>) -> Self {
        self.l3 = L3Spec::V6 {
            src: src.into().octets(),
            dst: dst.into().octets(),
            ext: Vec::new(),
        };
        self
    }

    /// IPv4 or IPv6 by address family (both must be the same family; IPv6 wins on a mix).
    pub fn ip(self, src: IpAddr, dst: IpAddr) -> Self {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => self.ipv4(s, d),
            (s, d) => self.ipv6(to_v6(s), to_v6(d)),
        }
    }

    /// Appends an IPv6 extension header (in order). Needs [`ipv6`](Self::ipv6) first.
    pub fn ipv6_ext(mut self, h: Ipv6Ext) -> Self {
        if let L3Spec::V6 { ext, .. } = &mut self.l3 {
            ext.push(h);
        }
        self
    }

    /// IPv4 TTL / IPv6 hop limit.
    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }

    /// IPv4 identification.
    pub fn ident(mut self, id: u16) -> Self {
        self.ident = id;
        self
    }

    /// IPv4 fragment offset (8-byte units) and MF flag.
    pub fn fragment(mut self, offset: u16, more: bool) -> Self {
        self.frag_offset = offset & crate::ipv4::OFFSET_MASK;
        self.more_frags = more;
        self
    }

    /// IPv4 DF flag.
    pub fn dont_frag(mut self, df: bool) -> Self {
        self.dont_frag = df;
        self
    }

    /// IPv4 TOS / IPv6 traffic class.
    pub fn tos(mut self, tos: u8) -> Self {
        self.tos = tos;
        self
    }

    /// IPv6 flow label (20 bits).
    pub fn flow_label(mut self, label: u32) -> Self {
        self.flow_label = label & 0xf_ffff;
        self
    }

    /// TCP with these ports (flags ACK, seq/ack 0 until set).
    pub fn tcp(mut self, src: u16, dst: u16) -> Self {
        self.l4 = L4Spec::Tcp {
            src,
            dst,
            flags: crate::tcp::flags::ACK,
            seq: 0,
            ack: 0,
            window: 0xffff,
        };
        self
    }

    /// TCP flags (needs [`tcp`](Self::tcp) first).
    pub fn tcp_flags(mut self, f: u8) -> Self {
        if let L4Spec::Tcp { flags, .. } = &mut self.l4 {
            *flags = f;
        }
        self
    }

    /// TCP sequence number.
    pub fn seq(mut self, v: u32) -> Self {
        if let L4Spec::Tcp { seq, .. } = &mut self.l4 {
            *seq = v;
        }
        self
    }

    /// TCP acknowledgment number.
    pub fn ack(mut self, v: u32) -> Self {
        if let L4Spec::Tcp { ack, .. } = &mut self.l4 {
            *ack = v;
        }
        self
    }

    /// UDP with these ports.
    pub fn udp(mut self, src: u16, dst: u16) -> Self {
        self.l4 = L4Spec::Udp { src, dst };
        self
    }

    /// ICMP (over IPv4) or ICMPv6 (over IPv6) echo request or reply.
    pub fn icmp_echo(mut self, ident: u16, seq: u16, reply: bool) -> Self {
        self.l4 = L4Spec::Echo { ident, seq, reply };
        self
    }

    /// Any other ICMP/ICMPv6 message type with 4 zero bytes of "rest of header".
    pub fn icmp(mut self, msg_type: u8, code: u8) -> Self {
        self.l4 = L4Spec::IcmpRaw { msg_type, code };
        self
    }

    /// A raw IP protocol number: the payload follows the IP headers directly.
    pub fn raw(mut self, proto: u8) -> Self {
        self.l4 = L4Spec::Raw(proto);
        self
    }

    /// Payload bytes after the last header.
    pub fn payload(mut self, data: &[u8]) -> Self {
        self.payload.clear();
        self.payload.extend_from_slice(data);
        self
    }

    /// Assembles the frame. Lengths that overflow their fields are the caller's bug (checked by
    /// `debug_assert`).
    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128 + self.payload.len());
        out.extend_from_slice(&self.dst_mac.0);
        out.extend_from_slice(&self.src_mac.0);
        let n = self.vlans.len();
        for (i, (tpid, tci)) in self.vlans.iter().enumerate() {
            let t = tpid.unwrap_or(if i + 1 == n {
                ethertype::VLAN
            } else {
                ethertype::QINQ
            });
            debug_assert!(is_vlan_tpid(t) || tpid.is_some());
            out.extend_from_slice(&t.to_be_bytes());
            out.extend_from_slice(&tci.to_be_bytes());
        }
        let (ethertype, v6) = match self.l3 {
            L3Spec::None(t) => (t, false),
            L3Spec::Arp { .. } => (ethertype::ARP, false),
            L3Spec::V4 { .. } => (ethertype::IPV4, false),
            L3Spec::V6 { .. } => (ethertype::IPV6, true),
        };
        out.extend_from_slice(&ethertype.to_be_bytes());
        let l3_start = out.len();
        let l4 = self.l4_bytes(v6);
        match &self.l3 {
            L3Spec::None(_) => {
                out.extend_from_slice(&self.payload);
            }
            L3Spec::Arp {
                operation,
                sender_ip,
                target_mac,
                target_ip,
            } => {
                let repr = crate::arp::ArpRepr {
                    operation: *operation,
                    sender_mac: self.src_mac,
                    sender_ip: *sender_ip,
                    target_mac: *target_mac,
                    target_ip: *target_ip,
                };
                out.resize(l3_start + crate::arp::PACKET_LEN, 0);
                let _ = repr.emit(&mut out[l3_start..]);
                out.extend_from_slice(&self.payload);
            }
            L3Spec::V4 { src, dst, options } => {
                let hlen = 20 + options.len();
                let total = hlen + l4.len();
                debug_assert!(total <= 0xffff, "IPv4 datagram too long");
                let flags = (self.frag_offset & 0x1fff)
                    | if self.more_frags {
                        crate::ipv4::FLAG_MF
                    } else {
                        0
                    }
                    | if self.dont_frag {
                        crate::ipv4::FLAG_DF
                    } else {
                        0
                    };
                out.push(0x40 | (hlen / 4) as u8);
                out.push(self.tos);
                out.extend_from_slice(&(total as u16).to_be_bytes());
                out.extend_from_slice(&self.ident.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                out.extend_from_slice(&[self.ttl, self.proto(false), 0, 0]);
                out.extend_from_slice(src);
                out.extend_from_slice(dst);
                out.extend_from_slice(options);
                let c = checksum::ipv4_header_checksum(&out[l3_start..l3_start + hlen]);
                out[l3_start + 10..l3_start + 12].copy_from_slice(&c.to_be_bytes());
                let l4_start = out.len();
                out.extend_from_slice(&l4);
                self.fill_l4_checksum(&mut out[l4_start..], |proto, seg| {
                    checksum::l4_checksum_v4(*src, *dst, proto, seg)
                });
            }
            L3Spec::V6 { src, dst, ext } => {
                let vtf = (6u32 << 28) | ((self.tos as u32) << 20) | self.flow_label;
                out.extend_from_slice(&vtf.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
                let first = ext.first().map_or(self.proto(true), Ipv6Ext::proto);
                out.extend_from_slice(&[first, self.ttl]);
                out.extend_from_slice(src);
                out.extend_from_slice(dst);
                for (i, e) in ext.iter().enumerate() {
                    let next = ext.get(i + 1).map_or(self.proto(true), Ipv6Ext::proto);
                    e.emit(next, &mut out);
                }
                let l4_start = out.len();
                out.extend_from_slice(&l4);
                let plen = out.len() - l3_start - 40;
                debug_assert!(plen <= 0xffff, "IPv6 payload too long");
                out[l3_start + 4..l3_start + 6].copy_from_slice(&(plen as u16).to_be_bytes());
                self.fill_l4_checksum(&mut out[l4_start..], |proto, seg| {
                    checksum::l4_checksum_v6(src, dst, proto, seg)
                });
            }
        }
        out
    }

    fn proto(&self, v6: bool) -> u8 {
        match self.l4 {
            L4Spec::Tcp { .. } => ip_proto::TCP,
            L4Spec::Udp { .. } => ip_proto::UDP,
            L4Spec::Echo { .. } | L4Spec::IcmpRaw { .. } if v6 => ip_proto::ICMPV6,
            L4Spec::Echo { .. } | L4Spec::IcmpRaw { .. } => ip_proto::ICMP,
            L4Spec::Raw(p) => p,
            L4Spec::None => ip_proto::IPV6_NONXT,
        }
    }

    /// The transport header and payload with a zero checksum field.
    fn l4_bytes(&self, v6: bool) -> Vec<u8> {
        let mut v = Vec::with_capacity(20 + self.payload.len());
        match self.l4 {
            L4Spec::Tcp {
                src,
                dst,
                flags,
                seq,
                ack,
                window,
            } => {
                v.extend_from_slice(&src.to_be_bytes());
                v.extend_from_slice(&dst.to_be_bytes());
                v.extend_from_slice(&seq.to_be_bytes());
                v.extend_from_slice(&ack.to_be_bytes());
                v.extend_from_slice(&[0x50, flags]);
                v.extend_from_slice(&window.to_be_bytes());
                v.extend_from_slice(&[0, 0, 0, 0]);
            }
            L4Spec::Udp { src, dst } => {
                let len = 8 + self.payload.len();
                debug_assert!(len <= 0xffff, "UDP datagram too long");
                v.extend_from_slice(&src.to_be_bytes());
                v.extend_from_slice(&dst.to_be_bytes());
                v.extend_from_slice(&(len as u16).to_be_bytes());
                v.extend_from_slice(&[0, 0]);
            }
            L4Spec::Echo { ident, seq, reply } => {
                let t = match (v6, reply) {
                    (false, false) => icmp::V4_ECHO_REQUEST,
                    (false, true) => icmp::V4_ECHO_REPLY,
                    (true, false) => icmp::V6_ECHO_REQUEST,
                    (true, true) => icmp::V6_ECHO_REPLY,
                };
                v.extend_from_slice(&[t, 0, 0, 0]);
                v.extend_from_slice(&ident.to_be_bytes());
                v.extend_from_slice(&seq.to_be_bytes());
            }
            L4Spec::IcmpRaw { msg_type, code } => {
                v.extend_from_slice(&[msg_type, code, 0, 0, 0, 0, 0, 0]);
            }
            L4Spec::Raw(_) | L4Spec::None => {}
        }
        v.extend_from_slice(&self.payload);
        v
    }

    fn fill_l4_checksum(&self, seg: &mut [u8], pseudo: impl Fn(u8, &[u8]) -> u16) {
        let at = match self.l4 {
            L4Spec::Tcp { .. } => 16,
            L4Spec::Udp { .. } => 6,
            L4Spec::Echo { .. } | L4Spec::IcmpRaw { .. } => 2,
            L4Spec::Raw(_) | L4Spec::None => return,
        };
        let v6 = matches!(self.l3, L3Spec::V6 { .. });
        let c = match self.l4 {
            // ICMPv4 has no pseudo header (RFC 792).
            L4Spec::Echo { .. } | L4Spec::IcmpRaw { .. } if !v6 => checksum::checksum(seg),
            L4Spec::Udp { .. } => checksum::udp_v4_wire(pseudo(self.proto(v6), seg)),
            _ => pseudo(self.proto(v6), seg),
        };
        seg[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
}

fn to_v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// The outer headers of a VXLAN packet: Ethernet / IPv4 or IPv6 / UDP / VXLAN (RFC 7348
/// section 5). The outer IPv4 header has DF set (RFC 7348 section 4.3 recommends not
/// fragmenting VXLAN packets) and a zero UDP checksum; over IPv6 the UDP checksum is computed
/// by [`vxlan_encap`] and by [`VxlanOuter::fill_udp_checksum`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanOuter {
    /// Outer source MAC.
    pub src_mac: MacAddr,
    /// Outer destination MAC (next hop).
    pub dst_mac: MacAddr,
    /// Underlay source address (VTEP).
    pub src_ip: IpAddr,
    /// Underlay destination address (remote VTEP); must be the same family as `src_ip`.
    pub dst_ip: IpAddr,
    /// UDP source port (usually a hash of the inner flow for ECMP entropy, RFC 7348 section 5).
    pub src_port: u16,
    /// UDP destination port (4789).
    pub dst_port: u16,
    /// The VNI.
    pub vni: Vni,
    /// Outer TTL / hop limit.
    pub ttl: u8,
}

/// Outer header length over IPv4: 14 + 20 + 8 + 8.
pub const VXLAN_V4_OVERHEAD: usize = 50;
/// Outer header length over IPv6: 14 + 40 + 8 + 8.
pub const VXLAN_V6_OVERHEAD: usize = 70;

impl VxlanOuter {
    /// An outer header with port 4789 and TTL 64.
    pub fn new(
        src_mac: MacAddr,
        dst_mac: MacAddr,
        src_ip: IpAddr,
        dst_ip: IpAddr,
        src_port: u16,
        vni: Vni,
    ) -> VxlanOuter {
        VxlanOuter {
            src_mac,
            dst_mac,
            src_ip,
            dst_ip,
            src_port,
            dst_port: vxlan::UDP_PORT,
            vni,
            ttl: 64,
        }
    }

    /// True when the underlay is IPv6 (either address being IPv6 makes it IPv6).
    pub fn is_ipv6(&self) -> bool {
        self.src_ip.is_ipv6() || self.dst_ip.is_ipv6()
    }

    /// Length of the outer headers: 50 (IPv4) or 70 (IPv6).
    pub fn header_len(&self) -> usize {
        if self.is_ipv6() {
            VXLAN_V6_OVERHEAD
        } else {
            VXLAN_V4_OVERHEAD
        }
    }

    /// Writes the outer headers for an inner frame of `inner_len` bytes into the first
    /// [`header_len`](Self::header_len) bytes of `dst`, with IPv4 total length and checksum, IPv6
    /// payload length and UDP length filled. The UDP checksum is written as 0 (for IPv6 call
    /// [`fill_udp_checksum`](Self::fill_udp_checksum) once the inner frame is in place, or keep
    /// 0 under RFC 6935). Errors: `dst` too short (`Truncated`), or `inner_len` too long for the
    /// length fields (`LengthMismatch`). Returns the header length.
    pub fn write_header(&self, dst: &mut [u8], inner_len: usize) -> Result<usize, WireError> {
        let hl = self.header_len();
        if dst.len() < hl {
            return Err(WireError::truncated(Layer::Vxlan, hl, dst.len()));
        }
        let udp_len = inner_len + 16;
        let v6 = self.is_ipv6();
        let limit = if v6 { 0xffff } else { 0xffff - 20 };
        if udp_len > limit {
            return Err(WireError::length(
                Layer::Udp,
                "length",
                limit as u32,
                udp_len.min(u32::MAX as usize) as u32,
            ));
        }
        dst[0..6].copy_from_slice(&self.dst_mac.0);
        dst[6..12].copy_from_slice(&self.src_mac.0);
        let udp = if v6 {
            dst[12..14].copy_from_slice(&ethertype::IPV6.to_be_bytes());
            let ip = &mut dst[14..54];
            ip[0..4].copy_from_slice(&(6u32 << 28).to_be_bytes());
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = ip_proto::UDP;
            ip[7] = self.ttl;
            ip[8..24].copy_from_slice(&to_v6(self.src_ip).octets());
            ip[24..40].copy_from_slice(&to_v6(self.dst_ip).octets());
            54
        } else {
            dst[12..14].copy_from_slice(&ethertype::IPV4.to_be_bytes());
            let ip = &mut dst[14..34];
            ip[0] = 0x45;
            ip[1] = 0;
            ip[2..4].copy_from_slice(&((udp_len + 20) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&[0, 0]);
            ip[6..8].copy_from_slice(&crate::ipv4::FLAG_DF.to_be_bytes());
            ip[8] = self.ttl;
            ip[9] = ip_proto::UDP;
            ip[10..12].copy_from_slice(&[0, 0]);
            ip[12..16].copy_from_slice(&v4_octets(self.src_ip));
            ip[16..20].copy_from_slice(&v4_octets(self.dst_ip));
            let c = checksum::ipv4_header_checksum(ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            34
        };
        let u = &mut dst[udp..udp + 16];
        u[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        u[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        u[6..8].copy_from_slice(&[0, 0]);
        let v = self.vni.get().to_be_bytes();
        u[8..16].copy_from_slice(&[vxlan::FLAG_I, 0, 0, 0, v[1], v[2], v[3], 0]);
        Ok(hl)
    }

    /// Computes the outer UDP checksum of a complete VXLAN-over-IPv6 `packet` (as written by
    /// [`write_header`](Self::write_header) followed by the inner frame). No-op over IPv4,
    /// where RFC 7348 section 5 says the checksum SHOULD be 0.
    pub fn fill_udp_checksum(&self, packet: &mut [u8]) {
        if !self.is_ipv6() || packet.len() < VXLAN_V6_OVERHEAD {
            return;
        }
        let src = to_v6(self.src_ip).octets();
        let dst = to_v6(self.dst_ip).octets();
        packet[60..62].copy_from_slice(&[0, 0]);
        let c = checksum::udp_v4_wire(checksum::l4_checksum_v6(
            &src,
            &dst,
            ip_proto::UDP,
            &packet[54..],
        ));
        packet[60..62].copy_from_slice(&c.to_be_bytes());
    }
}

fn v4_octets(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(v4) => v4.octets(),
        // Mixed families are a caller bug; write the low 4 bytes so the output is deterministic.
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    }
}

/// Wraps `inner_frame` in the outer headers of `outer`: a complete VXLAN packet with every
/// length and checksum filled (UDP checksum 0 over IPv4, computed over IPv6).
///
/// Panics if the inner frame is too long for the outer length fields (this is a test and
/// capture helper; the data path uses [`VxlanOuter::write_header`]).
pub fn vxlan_encap(inner_frame: &[u8], outer: &VxlanOuter) -> Vec<u8> {
    let hl = outer.header_len();
    let mut out = vec![0u8; hl + inner_frame.len()];
    outer
        .write_header(&mut out, inner_frame.len())
        .expect("inner frame fits the outer length fields");
    out[hl..].copy_from_slice(inner_frame);
    outer.fill_udp_checksum(&mut out);
    out
}
