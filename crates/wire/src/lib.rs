//! # spillway-wire
//!
//! Zero-copy packet parsing and emission for the Spillway data plane: Ethernet II with up to two
//! VLAN tags (802.1Q / 802.1ad), ARP, IPv4, IPv6 with extension headers, TCP, UDP, ICMP,
//! ICMPv6 and VXLAN. No allocation on the parse path, no I/O, no `unsafe`.
//!
//! ## Main types
//!
//! - [`parse_frame`] and [`ParsedFrame`] / [`Headers`]: the fast-path parse of a whole frame,
//!   outer and (for VXLAN) inner, into offsets, a [`FlowKey`], VLANs, fragment state and TCP
//!   flags.
//! - Per-header views in the smoltcp style, `XxxPacket<T: AsRef<[u8]>>` with `new_checked`,
//!   getters, and setters when `T: AsMut<[u8]>`: [`ethernet::EthernetFrame`], [`arp::ArpPacket`],
//!   [`ipv4::Ipv4Packet`], [`ipv6::Ipv6Packet`], [`tcp::TcpPacket`], [`udp::UdpPacket`],
//!   [`icmp::IcmpPacket`], [`vxlan::VxlanPacket`].
//! - [`nd`]: IPv6 neighbour discovery and MLD types, NS/NA with link-layer options
//!   ([`nd::NeighborRepr`]), and the addresses ND uses.
//! - [`checksum`]: RFC 1071 sums, pseudo headers, and RFC 1624 incremental updates for NAT.
//! - [`build`]: [`build::FrameBuilder`] and [`build::VxlanOuter`] to make frames with correct
//!   lengths and checksums (tests, benches, captures, encap templates).
//! - [`WireError`]: one `Copy` error naming the layer, the field, expected and actual values.
//!
//! ## Invariants
//!
//! - [`parse_frame`] never panics and never allocates; on `Ok`, every offset in [`Headers`]
//!   is `<= buf.len()`, and `payload_offset + payload_len <= l3_offset + l3_len <= buf.len()`
//!   for IP packets (the fuzz target checks this).
//! - Each layer is bounded by its container's length field, never by the buffer alone, so
//!   Ethernet padding is never mistaken for data.
//! - A [`FlowKey`] is present exactly for IPv4 and IPv6; its port convention (ICMP type and
//!   code in the destination port, a query's identifier in the source port, zero ports for
//!   non-first fragments) is documented on the type.
//! - Frames made by [`build::FrameBuilder`] parse back to exactly the fields that built them.
//!
//! ## Example
//!
//! ```
//! use spillway_wire::build::{FrameBuilder, VxlanOuter, vxlan_encap};
//! use spillway_wire::{parse_frame, Fragment, L3, MacAddr, ParseOptions, Vni, ip_proto};
//!
//! let inner = FrameBuilder::new()
//!     .ipv4([192, 168, 0, 1], [192, 168, 0, 2])
//!     .udp(5000, 53)
//!     .payload(b"query")
//!     .build();
//! let outer = VxlanOuter::new(
//!     MacAddr([2, 0, 0, 0, 0, 0xa]),
//!     MacAddr([2, 0, 0, 0, 0, 0xb]),
//!     "10.0.0.1".parse().unwrap(),
//!     "10.0.0.2".parse().unwrap(),
//!     49152,
//!     Vni::new(42).unwrap(),
//! );
//! let packet = vxlan_encap(&inner, &outer);
//! let parsed = parse_frame(&packet, &ParseOptions::default()).unwrap();
//! assert_eq!(parsed.vxlan.unwrap().vni.get(), 42);
//! let h = parsed.inner.unwrap();
//! assert_eq!(h.l3, L3::Ipv4);
//! assert_eq!(h.fragment, Fragment::None);
//! let key = h.key.unwrap();
//! assert_eq!((key.proto, key.src_port, key.dst_port), (ip_proto::UDP, 5000, 53));
//! let p = h.payload_offset as usize;
//! assert_eq!(&packet[p..p + h.payload_len as usize], b"query");
//! ```

#![deny(unsafe_code)]

pub mod error;
pub mod key;

pub mod arp;
pub mod build;
pub mod checksum;
pub mod ethernet;
mod field;
pub mod icmp;
pub mod icmp_error;
pub mod ipv4;
pub mod ipv6;
pub mod nd;
pub mod parse;
pub mod tcp;
pub mod udp;
pub mod vxlan;

pub use error::{ErrorKind, Layer, WireError};
pub use key::{FlowKey, IpAddr16, MacAddr, Vni, ip_proto};
pub use parse::{
    Decap, Fragment, FragmentFields, Headers, L3, ParseOptions, ParsedFrame, VxlanInfo,
    parse_frame, parse_frame_decap,
};
