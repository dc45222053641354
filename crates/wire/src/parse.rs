//! The full-stack parse: one call from the first byte of an Ethernet frame to the transport
//! ports, through VLAN tags, IPv4/IPv6 (with extension headers) and, for VXLAN, into the inner
//! frame. This is on the fast path, so it allocates nothing, cannot panic (every read goes
//! through a checked `first_chunk`/`get`), and reads each byte it needs once.
//!
//! # Tiers
//!
//! The common case is a short chain of fixed-size reads: Ethernet (14 bytes, plus 4 per tag),
//! then the IPv4 fixed header (20) or IPv6 fixed header (40), then the first 4-20 bytes of the
//! transport header. Each read is one bounds check against a shrinking "available" length, so
//! the compiler can keep the loads unchecked after it. Less common shapes (IPv4 options, IPv6
//! extension headers, fragments, ARP, ICMP) branch off the same chain without slowing it: the
//! IPv6 extension walk is a loop that runs zero times for a plain TCP/UDP packet, and the VXLAN
//! inner parse is the same function called again with the inner frame's bounds.
//!
//! # Lengths
//!
//! Every layer is bounded by the layer that contains it, not by the buffer: the IPv4 total
//! length / IPv6 payload length bound the transport header (so Ethernet padding is never read
//! as data), and the UDP length bounds a VXLAN inner frame. All offsets are from the start of
//! the buffer given to [`parse_frame`], which must therefore be at most 65535 bytes long
//! (longer buffers are rejected with `BadField("frame length")`).

use crate::error::{Layer, WireError};
use crate::ethernet::{self, ethertype};
use crate::icmp;
use crate::ipv6::{self, walk_ext_headers};
use crate::key::{FlowKey, IpAddr16, MacAddr, Vni, ip_proto};
use crate::{arp, vxlan};

/// What [`parse_frame`] needs to know beyond the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// UDP destination port that marks a VXLAN packet (RFC 7348 section 5: 4789).
    pub vxlan_port: u16,
}

impl Default for ParseOptions {
    fn default() -> Self {
        ParseOptions {
            vxlan_port: vxlan::UDP_PORT,
        }
    }
}

/// Which outer datagrams [`parse_frame_decap`] decapsulates as VXLAN. A switch decides this by
/// where a frame arrived, not by its bytes: UDP to port 4789 from a tenant's VM is the tenant's
/// own traffic (it may run its own overlay, or just use that port), and only the uplink carries
/// this host's underlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decap {
    /// Never: every UDP datagram is plain UDP.
    Off,
    /// UDP datagrams to `port` addressed to `vtep` (not fragments), and no others.
    Vxlan {
        /// The VXLAN UDP destination port.
        port: u16,
        /// The only outer destination address decapsulated (this host's VTEP).
        vtep: IpAddr16,
    },
}

/// The network layer found after the Ethernet header and its tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum L3 {
    /// An EtherType Spillway does not parse further (the frame is still valid).
    #[default]
    Other,
    /// A validated Ethernet/IPv4 ARP packet.
    Arp,
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// Fragmentation state of an IP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fragment {
    /// Not a fragment (IPv4 MF = 0 and offset 0; IPv6 without a fragment header, or an atomic
    /// fragment with M = 0 and offset 0).
    #[default]
    None,
    /// The first fragment (offset 0, more fragments follow): the transport header is parsed.
    First,
    /// A later fragment: its bytes are not a transport header, so the key's ports are zero.
    /// For IPv6 the walk stops at the fragment header: the key's protocol is that header's Next
    /// Header (which may itself be an extension header), and `l4_offset` points just after it.
    NonFirst,
}

/// The fragmentation fields of an IP datagram, as the header carries them (RFC 791 section 3.1
/// for IPv4, RFC 8200 section 4.5 for the IPv6 Fragment header). For an IPv6 packet without a
/// fragment header every field is 0 / false.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FragmentFields {
    /// Identification: IPv4's 16 bits (set for every IPv4 packet, fragment or not), IPv6's 32.
    pub id: u32,
    /// Fragment offset in 8-octet units (13 bits).
    pub offset: u16,
    /// More-fragments flag (IPv4 MF, IPv6 M).
    pub more: bool,
    /// Absolute offset of the fragment's data, the bytes `offset` counts from: just after the
    /// IPv4 header with its options, or just after the IPv6 Fragment header. For a packet that
    /// is not a fragment it is where that data would start (IPv4) or 0 (IPv6).
    pub data_offset: u16,
}

impl FragmentFields {
    /// The fragment's data as a byte range of the original datagram's fragmentable part:
    /// `(start, end)`, `end` exclusive, from the headers of this fragment.
    #[inline]
    pub fn byte_range(&self, h: &Headers) -> (u32, u32) {
        let start = u32::from(self.offset) * 8;
        let end_abs = u32::from(h.l3_offset) + u32::from(h.l3_len);
        (
            start,
            start + end_abs.saturating_sub(u32::from(self.data_offset)),
        )
    }
}

/// The headers of one Ethernet frame. All offsets are from the start of the buffer given to
/// [`parse_frame`] (also for an inner frame), so they can be used to index it directly.
///
/// For non-IP frames (`l3` is `Other` or `Arp`): `key` is `None`, `l4_offset` and
/// `payload_offset` both point at the end of the L3 data (`l3_offset + l3_len`) and
/// `payload_len` is 0. For IP packets without ports (non-first fragments, AH/ESP/No Next
/// Header, unknown protocols) `payload_offset == l4_offset` and `payload_len` counts every byte
/// after the IP headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Headers {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Destination MAC.
    pub dst_mac: MacAddr,
    /// VLAN TCIs, outermost first; only the first `vlan_count` are meaningful, the rest are 0.
    pub vlans: [u16; 2],
    /// Number of VLAN tags (0..=2).
    pub vlan_count: u8,
    /// The EtherType after the tags.
    pub ethertype: u16,
    /// Which network layer was found.
    pub l3: L3,
    /// Offset of the network header.
    pub l3_offset: u16,
    /// Length of the network datagram from its first byte: IPv4 total length, IPv6 40 + payload
    /// length, 28 for ARP, the rest of the frame for `Other`. Excludes Ethernet padding.
    pub l3_len: u16,
    /// The 5-tuple; `Some` exactly for IPv4 and IPv6.
    pub key: Option<FlowKey>,
    /// Fragmentation state.
    pub fragment: Fragment,
    /// The fragmentation fields (identification, offset, more-fragments).
    pub frag: FragmentFields,
    /// Offset of the transport header (after IPv4 options / IPv6 extension headers).
    pub l4_offset: u16,
    /// Offset of the transport payload (after the TCP header with options, UDP's 8 bytes,
    /// ICMP's 8 bytes); for VXLAN this is the VXLAN header.
    pub payload_offset: u16,
    /// Transport payload length (UDP: length field - 8; others: to the end of the datagram).
    pub payload_len: u16,
    /// TCP flag byte (0 for other protocols).
    pub tcp_flags: u8,
    /// IPv4 TTL or IPv6 hop limit (0 for non-IP).
    pub ttl: u8,
}

/// Where the VXLAN header and the inner frame are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VxlanInfo {
    /// The VNI.
    pub vni: Vni,
    /// Offset of the VXLAN header (equals the outer `payload_offset`).
    pub offset: u16,
    /// Offset of the inner Ethernet header (`offset + 8`).
    pub inner_offset: u16,
    /// Length of the inner Ethernet frame (outer UDP length - 16).
    pub inner_len: u16,
}

/// A parsed frame: the outer headers and, for VXLAN, the VXLAN info and the inner headers
/// (`vxlan.is_some() == inner.is_some()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParsedFrame {
    /// The outermost headers; for VXLAN, `outer.key` is the underlay 5-tuple.
    pub outer: Headers,
    /// Present when the outer packet is UDP to the VXLAN port (with [`parse_frame_decap`], also
    /// addressed to the VTEP) and not a fragment.
    pub vxlan: Option<VxlanInfo>,
    /// The inner frame's headers, offsets still from the start of the outer buffer.
    pub inner: Option<Headers>,
}

impl ParsedFrame {
    /// The headers a policy decision is made on: the inner frame for VXLAN, else the outer.
    #[inline]
    pub fn innermost(&self) -> &Headers {
        match &self.inner {
            Some(h) => h,
            None => &self.outer,
        }
    }
}

const MAX_FRAME: usize = u16::MAX as usize;

/// Parses one Ethernet frame (and its VXLAN inner frame) from `buf`. See the module docs for
/// the length rules. Errors inside the inner frame have `WireError::inner` set; errors in the
/// VXLAN header itself are reported at layer `Vxlan` with `inner == false`. The inner frame is
/// not checked for VXLAN again.
#[inline]
pub fn parse_frame(buf: &[u8], opts: &ParseOptions) -> Result<ParsedFrame, WireError> {
    parse_frame_vxlan(buf, Some(opts.vxlan_port), None)
}

/// [`parse_frame`], decapsulating only what `decap` names: with [`Decap::Off`] a UDP datagram
/// to the VXLAN port is plain UDP (its payload is never read), and with [`Decap::Vxlan`] only
/// datagrams addressed to the VTEP are parsed as VXLAN, so a VXLAN-looking datagram to another
/// address is plain UDP too.
#[inline]
pub fn parse_frame_decap(buf: &[u8], decap: Decap) -> Result<ParsedFrame, WireError> {
    match decap {
        Decap::Off => parse_frame_vxlan(buf, None, None),
        Decap::Vxlan { port, vtep } => parse_frame_vxlan(buf, Some(port), Some(vtep)),
    }
}

/// The parse, decapsulating UDP to `port` (none: never) addressed to `vtep` (none: any).
#[inline(always)]
fn parse_frame_vxlan(
    buf: &[u8],
    port: Option<u16>,
    vtep: Option<IpAddr16>,
) -> Result<ParsedFrame, WireError> {
    if buf.len() > MAX_FRAME {
        return Err(WireError::bad_field(
            Layer::Ethernet,
            "frame length",
            MAX_FRAME as u32,
            buf.len() as u32,
        ));
    }
    let mut out = ParsedFrame {
        outer: Headers::default(),
        vxlan: None,
        inner: None,
    };
    // Parse into the output in place: `Headers` is ~80 bytes, and building it in a temporary
    // and moving it costs as much as the parse itself.
    parse_headers(&mut out.outer, buf, 0)?;
    let outer = &out.outer;
    let is_vxlan = match &outer.key {
        Some(k) => {
            k.proto == ip_proto::UDP
                && Some(k.dst_port) == port
                && vtep.is_none_or(|v| k.dst_ip == v)
                && outer.fragment == Fragment::None
        }
        None => false,
    };
    if !is_vxlan {
        return Ok(out);
    }
    let off = outer.payload_offset as usize;
    let end = off + outer.payload_len as usize;
    // `end <= buf.len()` was checked against the UDP length; `get` keeps this panic-free anyway.
    let udp_data = buf.get(..end).unwrap_or(buf);
    let Some(vx) = udp_data
        .get(off..)
        .and_then(|s| s.first_chunk::<{ vxlan::HEADER_LEN }>())
    else {
        return Err(WireError::truncated(
            Layer::Vxlan,
            vxlan::HEADER_LEN,
            outer.payload_len as usize,
        ));
    };
    if vx[0] & vxlan::FLAG_I == 0 {
        return Err(WireError::bad_field(
            Layer::Vxlan,
            "I flag",
            vxlan::FLAG_I as u32,
            vx[0] as u32,
        ));
    }
    let vni = Vni::new(u32::from_be_bytes([0, vx[4], vx[5], vx[6]])).unwrap_or_default();
    let inner_offset = off + vxlan::HEADER_LEN;
    out.vxlan = Some(VxlanInfo {
        vni,
        offset: off as u16,
        inner_offset: inner_offset as u16,
        inner_len: (end - inner_offset) as u16,
    });
    let inner = out.inner.insert(Headers::default());
    parse_headers(inner, udp_data, inner_offset).map_err(WireError::in_inner)?;
    Ok(out)
}

/// An IPv4 address in mapped form, built as one 128-bit value so it is a single store.
#[inline(always)]
fn v4_mapped(b: [u8; 4]) -> IpAddr16 {
    let v = (0xffff_u128 << 32) | u32::from_be_bytes(b) as u128;
    IpAddr16(v.to_be_bytes())
}

/// Parses the frame starting at `start` and ending at `buf.len()`.
/// `h` must be `Headers::default()`.
#[inline(always)]
fn parse_headers(h: &mut Headers, buf: &[u8], start: usize) -> Result<(), WireError> {
    // Ethernet and tags are read straight into `h` rather than through `EthernetRepr`: a
    // returned temporary written with narrow stores and read back wide stalls store forwarding,
    // which cost more than the rest of the parse.
    let Some(e) = buf
        .get(start..)
        .and_then(|f| f.first_chunk::<{ ethernet::HEADER_LEN }>())
    else {
        return Err(truncated(
            Layer::Ethernet,
            ethernet::HEADER_LEN,
            buf.len().saturating_sub(start),
        ));
    };
    h.dst_mac = MacAddr([e[0], e[1], e[2], e[3], e[4], e[5]]);
    h.src_mac = MacAddr([e[6], e[7], e[8], e[9], e[10], e[11]]);
    let mut ethertype = u16::from_be_bytes([e[12], e[13]]);
    let mut l3_offset = start + ethernet::HEADER_LEN;
    if ethernet::is_vlan_tpid(ethertype) {
        let mut n = 0usize;
        while ethernet::is_vlan_tpid(ethertype) {
            if n == ethernet::VLAN_TAGS_MAX {
                return Err(WireError::too_deep(Layer::Vlan, "vlan tags", 2, 3));
            }
            let Some(t) = buf.get(l3_offset..).and_then(|f| f.first_chunk::<4>()) else {
                return Err(truncated(
                    Layer::Vlan,
                    l3_offset - start + ethernet::VLAN_TAG_LEN,
                    buf.len() - start,
                ));
            };
            h.vlans[n] = u16::from_be_bytes([t[0], t[1]]);
            ethertype = u16::from_be_bytes([t[2], t[3]]);
            n += 1;
            l3_offset += ethernet::VLAN_TAG_LEN;
        }
        h.vlan_count = n as u8;
    }
    h.ethertype = ethertype;
    h.l3_offset = l3_offset as u16;
    let l3 = buf.get(l3_offset..).unwrap_or_default();
    match ethertype {
        ethertype::IPV4 => parse_ipv4(h, buf, l3)?,
        ethertype::IPV6 => parse_ipv6(h, buf, l3)?,
        ethertype::ARP => {
            arp::ArpPacket::new_checked(l3)?;
            h.l3 = L3::Arp;
            h.l3_len = arp::PACKET_LEN as u16;
            h.l4_offset = (l3_offset + arp::PACKET_LEN) as u16;
            h.payload_offset = h.l4_offset;
        }
        _ => {
            h.l3_len = l3.len() as u16;
            h.l4_offset = buf.len() as u16;
            h.payload_offset = h.l4_offset;
        }
    }
    Ok(())
}

#[inline(always)]
fn parse_ipv4(h: &mut Headers, buf: &[u8], l3: &[u8]) -> Result<(), WireError> {
    let ip: &[u8; 20] = l3
        .first_chunk()
        .ok_or_else(|| truncated(Layer::Ipv4, 20, l3.len()))?;
    let hlen = ((ip[0] & 0x0f) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    // One combined test on the fast path; the cold function finds out which rule failed.
    // `hlen <= total <= l3.len()` also proves the header itself is present.
    if !(ip[0] >> 4 == 4 && hlen >= 20 && hlen <= total && total <= l3.len()) {
        return Err(ipv4_error(ip, l3.len()));
    }
    let fo = u16::from_be_bytes([ip[6], ip[7]]);
    let offset = fo & crate::ipv4::OFFSET_MASK;
    h.fragment = if offset != 0 {
        Fragment::NonFirst
    } else if fo & crate::ipv4::FLAG_MF != 0 {
        Fragment::First
    } else {
        Fragment::None
    };
    h.frag = FragmentFields {
        id: u32::from(u16::from_be_bytes([ip[4], ip[5]])),
        offset,
        more: fo & crate::ipv4::FLAG_MF != 0,
        data_offset: (h.l3_offset as usize + hlen) as u16,
    };
    h.l3 = L3::Ipv4;
    h.l3_len = total as u16;
    h.ttl = ip[8];
    let key = FlowKey {
        src_ip: v4_mapped([ip[12], ip[13], ip[14], ip[15]]),
        dst_ip: v4_mapped([ip[16], ip[17], ip[18], ip[19]]),
        src_port: 0,
        dst_port: 0,
        proto: ip[9],
    };
    let l4_abs = h.l3_offset as usize + hlen;
    let l3_end = h.l3_offset as usize + total;
    let dgram = buf.get(..l3_end).unwrap_or_default();
    parse_l4(h, key, dgram, l4_abs, offset != 0, false)
}

#[cold]
#[inline(never)]
fn ipv4_error(ip: &[u8; 20], avail: usize) -> WireError {
    let hlen = ((ip[0] & 0x0f) as usize) * 4;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if ip[0] >> 4 != 4 {
        WireError::bad_field(Layer::Ipv4, "version", 4, (ip[0] >> 4) as u32)
    } else if hlen < 20 {
        WireError::bad_field(Layer::Ipv4, "ihl", 5, (hlen / 4) as u32)
    } else if hlen > avail {
        WireError::truncated(Layer::Ipv4, hlen, avail)
    } else if total < hlen {
        WireError::length(Layer::Ipv4, "total length", hlen as u32, total as u32)
    } else {
        WireError::length(Layer::Ipv4, "total length", avail as u32, total as u32)
    }
}

#[cold]
#[inline(never)]
fn udp_error(len: usize, avail: usize) -> WireError {
    if len < 8 {
        WireError::length(Layer::Udp, "length", 8, len as u32)
    } else {
        WireError::length(Layer::Udp, "length", avail as u32, len as u32)
    }
}

#[cold]
#[inline(never)]
fn tcp_error(doff: usize, avail: usize) -> WireError {
    if doff < 20 {
        WireError::bad_field(Layer::Tcp, "data offset", 5, (doff / 4) as u32)
    } else {
        WireError::truncated(Layer::Tcp, doff, avail)
    }
}

#[cold]
#[inline(never)]
fn truncated(layer: Layer, expected: usize, actual: usize) -> WireError {
    WireError::truncated(layer, expected, actual)
}

#[inline(always)]
fn parse_ipv6(h: &mut Headers, buf: &[u8], l3: &[u8]) -> Result<(), WireError> {
    let ip: &[u8; 40] = l3
        .first_chunk()
        .ok_or_else(|| truncated(Layer::Ipv6, 40, l3.len()))?;
    if ip[0] >> 4 != 6 {
        return Err(WireError::bad_field(
            Layer::Ipv6,
            "version",
            6,
            (ip[0] >> 4) as u32,
        ));
    }
    let plen = u16::from_be_bytes([ip[4], ip[5]]) as usize;
    let avail = l3.len() - ipv6::HEADER_LEN;
    if plen > avail {
        return Err(WireError::length(
            Layer::Ipv6,
            "payload length",
            avail as u32,
            plen as u32,
        ));
    }
    let total = ipv6::HEADER_LEN + plen;
    if total > MAX_FRAME {
        return Err(WireError::length(
            Layer::Ipv6,
            "payload length",
            (MAX_FRAME - ipv6::HEADER_LEN) as u32,
            plen as u32,
        ));
    }
    h.l3 = L3::Ipv6;
    h.l3_len = total as u16;
    h.ttl = ip[7];
    let mut src = [0u8; 16];
    src.copy_from_slice(&ip[8..24]);
    let mut dst = [0u8; 16];
    dst.copy_from_slice(&ip[24..40]);
    let mut key = FlowKey {
        src_ip: IpAddr16(src),
        dst_ip: IpAddr16(dst),
        src_port: 0,
        dst_port: 0,
        proto: ip[6],
    };
    let payload_abs = h.l3_offset as usize + ipv6::HEADER_LEN;
    let l3_end = payload_abs + plen;
    let dgram = buf.get(..l3_end).unwrap_or_default();
    let (l4_abs, opaque) = match ip[6] {
        ip_proto::TCP | ip_proto::UDP | ip_proto::ICMPV6 => (payload_abs, false),
        next => {
            let w = walk_ext_headers(next, dgram.get(payload_abs..).unwrap_or_default())?;
            key.proto = w.proto;
            h.fragment = match w.fragment {
                Some((0, false)) | None => Fragment::None,
                Some((0, true)) => Fragment::First,
                Some(_) => Fragment::NonFirst,
            };
            if let Some((offset, more)) = w.fragment {
                h.frag = FragmentFields {
                    id: w.frag_id,
                    offset,
                    more,
                    data_offset: (payload_abs + w.frag_end) as u16,
                };
            }
            (payload_abs + w.l4_offset, w.opaque)
        }
    };
    parse_l4(h, key, dgram, l4_abs, opaque, true)
}

/// Reads the transport header at `l4` within `dgram` (the buffer cut at the end of the IP
/// datagram) and fills ports, flags and payload bounds.
#[inline(always)]
fn parse_l4(
    h: &mut Headers,
    mut key: FlowKey,
    dgram: &[u8],
    l4: usize,
    opaque: bool,
    v6: bool,
) -> Result<(), WireError> {
    let seg = dgram.get(l4..).unwrap_or_default();
    h.l4_offset = l4 as u16;
    let mut payload_off = 0usize;
    let mut payload_len = seg.len();
    if !opaque {
        match key.proto {
            ip_proto::TCP => {
                let t: &[u8; 20] = seg
                    .first_chunk()
                    .ok_or_else(|| truncated(Layer::Tcp, 20, seg.len()))?;
                let doff = (t[12] >> 4) as usize * 4;
                if !(doff >= 20 && doff <= seg.len()) {
                    return Err(tcp_error(doff, seg.len()));
                }
                key.src_port = u16::from_be_bytes([t[0], t[1]]);
                key.dst_port = u16::from_be_bytes([t[2], t[3]]);
                h.tcp_flags = t[13];
                payload_off = doff;
                payload_len = seg.len() - doff;
            }
            ip_proto::UDP => {
                let u: &[u8; 8] = seg
                    .first_chunk()
                    .ok_or_else(|| truncated(Layer::Udp, 8, seg.len()))?;
                let len = u16::from_be_bytes([u[4], u[5]]) as usize;
                // RFC 768: the length covers the whole datagram, which a first fragment
                // (RFC 791 section 3.2, RFC 8200 section 4.5) carries only the start of; there
                // it bounds nothing we can check, and the payload is what this fragment holds.
                let first = h.fragment == Fragment::First;
                if !(len >= 8 && (first || len <= seg.len())) {
                    return Err(udp_error(len, seg.len()));
                }
                key.src_port = u16::from_be_bytes([u[0], u[1]]);
                key.dst_port = u16::from_be_bytes([u[2], u[3]]);
                payload_off = 8;
                payload_len = if first { seg.len() - 8 } else { len - 8 };
            }
            ip_proto::ICMP | ip_proto::ICMPV6 if (key.proto == ip_proto::ICMPV6) == v6 => {
                let layer = if v6 { Layer::Icmpv6 } else { Layer::Icmp };
                let m: &[u8; 8] = seg
                    .first_chunk()
                    .ok_or_else(|| truncated(layer, 8, seg.len()))?;
                // nf_conntrack's tuple (see `FlowKey`): type and code always, the identifier
                // only where the message has one.
                key.dst_port = u16::from_be_bytes([m[0], m[1]]);
                if icmp::is_query(v6, m[0]) {
                    key.src_port = u16::from_be_bytes([m[4], m[5]]);
                }
                payload_off = 8;
                payload_len = seg.len() - 8;
            }
            _ => {}
        }
    }
    h.payload_offset = (l4 + payload_off) as u16;
    h.payload_len = payload_len as u16;
    h.key = Some(key);
    Ok(())
}

/// The VLAN limit, re-exported for callers that size arrays by it.
pub const VLAN_TAGS_MAX: usize = ethernet::VLAN_TAGS_MAX;
