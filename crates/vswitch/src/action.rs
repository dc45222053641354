//! Flow-entry actions and the executor that applies them to a frame.
//!
//! An [`ActionList`] is the header transformation of one unified flow entry: an ordered, bounded
//! list of [`Action`]s ending in `Output` or `Drop`. The slow path builds it; the fast path (and the
//! slow path, for the packet that caused it) runs [`apply`]. Because both paths run this one
//! function on the same list, they produce the same bytes and the same verdict by construction.
//!
//! Order matters and is fixed by the builder: `Decap` first (the rest then address the inner
//! frame), then `Route` (so a packet the router refuses is still as its sender sent it, ready
//! to be quoted in the ICMP error), then NAT rewrites, then MAC rewrites, then `Encap`, then the
//! terminal action.
//! Checksums are updated incrementally (RFC 1624); nothing here allocates.

use crate::ids::{PortId, SecurityGroupId};
use crate::packet::PacketBuf;
use crate::verdict::{DropKind, DropReason, Verdict};
use core::net::IpAddr;
use spillway_wire::build::VxlanOuter;
use spillway_wire::checksum;
use spillway_wire::icmp::IcmpKind;
use spillway_wire::icmp_error;
use spillway_wire::{Fragment, Headers, IpAddr16, MacAddr, ParsedFrame, Vni, ip_proto};

/// Which end of the 5-tuple a NAT action rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatSide {
    /// Source address and port (SNAT on the way out).
    Source,
    /// Destination address and port (un-SNAT of the return traffic).
    Destination,
}

/// One step of a flow entry's header transformation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Strip the outer Ethernet/IP/UDP/VXLAN headers; later actions address the inner frame.
    Decap,
    /// The tenant router forwards the packet (RFC 1812 section 5.3.1, RFC 8200 section 3): a
    /// TTL or hop limit of 1 or less stops it (`Drop(TtlExpired)`), an IP packet longer than
    /// `mtu` stops it (`Drop(PacketTooBig { mtu })`), and otherwise the TTL / hop limit is
    /// decremented (the IPv4 header checksum incrementally). The pipeline turns those two drops
    /// into ICMP errors to the sender ([`crate::router`]).
    Route {
        /// The largest IP packet the next link carries.
        mtu: u16,
    },
    /// Rewrite one end's IPv4 address and port (for ICMP echo: the identifier), updating the IPv4
    /// header checksum and the TCP/UDP/ICMP checksum incrementally.
    Nat {
        /// Which end.
        side: NatSide,
        /// The new address (IPv4-mapped).
        ip: IpAddr16,
        /// The new port or ICMP echo identifier.
        port: u16,
    },
    /// Rewrite the Ethernet source and destination MACs of the current frame.
    SetMacs {
        /// New source MAC.
        src: MacAddr,
        /// New destination MAC.
        dst: MacAddr,
    },
    /// Prepend concrete VXLAN outer headers (RFC 7348 section 5): everything but the length
    /// fields and the IPv4 header checksum is fixed when the entry is built. The outer UDP
    /// checksum is 0, over IPv6 too as RFC 6935/6936 allow for tunnels, so the fast path never
    /// sums the payload.
    Encap(VxlanOuter),
    /// Transmit on this port (terminal).
    Output(PortId),
    /// Drop (terminal).
    Drop(DropReason),
}

/// Bytes an [`ActionList`] can hold. The longest list the slow path builds is Route (3) +
/// SetMacs (13) + Encap over IPv6 (54) + Output (5) = 75 bytes; 88 leaves room for a NAT step and a decap while
/// keeping a whole flow entry within four cache lines.
pub const ACTION_BYTES: usize = 88;

/// Most actions a list may hold, whatever their encoded size.
pub const ACTIONS_MAX: usize = 6;

// Opcodes of the encoded form. Each op is its tag followed by a fixed payload:
//   DECAP                                        (1 byte)
//   ROUTE              mtu[2]                    (3)
//   NAT_SRC | NAT_DST  ip[16] port[2]            (19)
//   SET_MACS           src[6] dst[6]             (13)
//   ENCAP4             src_mac[6] dst_mac[6] src_ip[4] dst_ip[4] sport[2] dport[2] vni[3] ttl (29)
//   ENCAP6             src_mac[6] dst_mac[6] src_ip[16] dst_ip[16] sport[2] dport[2] vni[3] ttl (53)
//   OUTPUT             port[4]                   (5)
//   DROP               kind a[4] b[4]            (10)
// Multi-byte integers are little-endian (host order on every target we build for; the format
// never leaves the process).
const OP_DECAP: u8 = 1;
const OP_NAT_SRC: u8 = 2;
const OP_NAT_DST: u8 = 3;
const OP_SET_MACS: u8 = 4;
const OP_ENCAP4: u8 = 5;
const OP_ENCAP6: u8 = 6;
const OP_OUTPUT: u8 = 7;
const OP_DROP: u8 = 8;
const OP_ROUTE: u8 = 9;

/// A bounded, ordered action list in a compact encoded form (see the module doc for the order).
///
/// The fast path reads it in place: a decap-and-deliver entry is 19 bytes of ops, an encap entry
/// 47 (IPv4 underlay), so a hit touches one or two cache lines of actions instead of a list of
/// enum slots sized for the largest variant. [`ActionList::push`] encodes a rich [`Action`];
/// [`ActionList::iter`] decodes them back for explanations and tests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ActionList {
    bytes: [u8; ACTION_BYTES],
    len: u8,
    count: u8,
}

/// Why an action could not be appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActionListError {
    /// The list has no room for the action's encoding.
    #[error(
        "action list full: {needed} more bytes needed, {available} available (of {ACTION_BYTES}), or more than {ACTIONS_MAX} actions"
    )]
    Full {
        /// Encoded size of the action.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// The drop reason carries detail a flow entry cannot hold (a parse error belongs to one
    /// packet, never to a flow).
    #[error("drop reason {0:?} cannot be installed in a flow entry")]
    NotInstallable(DropKind),
    /// Encap addresses of different families.
    #[error("encap source and destination must be the same address family")]
    MixedFamilies,
}

impl Default for ActionList {
    fn default() -> Self {
        ActionList::new()
    }
}

impl core::fmt::Debug for ActionList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl ActionList {
    /// An empty list (applying it drops with `PolicyDrop`: a list must end in a terminal action).
    pub const fn new() -> ActionList {
        ActionList {
            bytes: [0; ACTION_BYTES],
            len: 0,
            count: 0,
        }
    }

    /// Append an action.
    pub fn push(&mut self, a: Action) -> Result<(), ActionListError> {
        let mut buf = [0u8; 64];
        let n = encode(&a, &mut buf)?;
        let at = usize::from(self.len);
        if at + n > ACTION_BYTES || usize::from(self.count) >= ACTIONS_MAX {
            return Err(ActionListError::Full {
                needed: n,
                available: ACTION_BYTES - at,
            });
        }
        self.bytes[at..at + n].copy_from_slice(&buf[..n]);
        self.len += n as u8;
        self.count += 1;
        Ok(())
    }

    /// A list built from `actions`, in order.
    pub fn from_actions(actions: &[Action]) -> Result<ActionList, ActionListError> {
        let mut l = ActionList::new();
        for a in actions {
            l.push(*a)?;
        }
        Ok(l)
    }

    /// Number of actions.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// True when the list holds no action.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        usize::from(self.len)
    }

    /// The actions, decoded, in order.
    pub fn iter(&self) -> impl Iterator<Item = Action> + '_ {
        let mut at = 0usize;
        core::iter::from_fn(move || {
            let (a, n) = decode(&self.bytes[at..usize::from(self.len)])?;
            at += n;
            Some(a)
        })
    }

    /// The output port, when the list ends in `Output`.
    pub fn output(&self) -> Option<PortId> {
        match self.iter().last() {
            Some(Action::Output(p)) => Some(p),
            _ => None,
        }
    }
}

fn encode(a: &Action, out: &mut [u8; 64]) -> Result<usize, ActionListError> {
    Ok(match *a {
        Action::Decap => {
            out[0] = OP_DECAP;
            1
        }
        Action::Route { mtu } => {
            out[0] = OP_ROUTE;
            out[1..3].copy_from_slice(&mtu.to_le_bytes());
            3
        }
        Action::Nat { side, ip, port } => {
            out[0] = if side == NatSide::Source {
                OP_NAT_SRC
            } else {
                OP_NAT_DST
            };
            out[1..17].copy_from_slice(&ip.0);
            out[17..19].copy_from_slice(&port.to_le_bytes());
            19
        }
        Action::SetMacs { src, dst } => {
            out[0] = OP_SET_MACS;
            out[1..7].copy_from_slice(&src.0);
            out[7..13].copy_from_slice(&dst.0);
            13
        }
        Action::Encap(e) => {
            out[1..7].copy_from_slice(&e.src_mac.0);
            out[7..13].copy_from_slice(&e.dst_mac.0);
            let at = match (e.src_ip, e.dst_ip) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    out[0] = OP_ENCAP4;
                    out[13..17].copy_from_slice(&s.octets());
                    out[17..21].copy_from_slice(&d.octets());
                    21
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => {
                    out[0] = OP_ENCAP6;
                    out[13..29].copy_from_slice(&s.octets());
                    out[29..45].copy_from_slice(&d.octets());
                    45
                }
                _ => return Err(ActionListError::MixedFamilies),
            };
            out[at..at + 2].copy_from_slice(&e.src_port.to_le_bytes());
            out[at + 2..at + 4].copy_from_slice(&e.dst_port.to_le_bytes());
            out[at + 4..at + 7].copy_from_slice(&e.vni.get().to_le_bytes()[..3]);
            out[at + 7] = e.ttl;
            at + 8
        }
        Action::Output(p) => {
            out[0] = OP_OUTPUT;
            out[1..5].copy_from_slice(&p.0.to_le_bytes());
            5
        }
        Action::Drop(r) => {
            let (a, b) = match r {
                DropReason::Malformed(_) => {
                    return Err(ActionListError::NotInstallable(DropKind::Malformed));
                }
                DropReason::UnknownPort(p) => (p.0, 0),
                DropReason::UnknownVni(v) => (v, 0),
                DropReason::UnsupportedEtherType(t) => (u32::from(t), 0),
                DropReason::SecurityGroupDeny { group, rule } => (group.0, rule),
                DropReason::PacketTooBig { mtu } => (u32::from(mtu), 0),
                _ => (0, 0),
            };
            out[0] = OP_DROP;
            out[1] = r.kind() as u8;
            out[2..6].copy_from_slice(&a.to_le_bytes());
            out[6..10].copy_from_slice(&b.to_le_bytes());
            10
        }
    })
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn mac_at(b: &[u8], at: usize) -> MacAddr {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[at..at + 6]);
    MacAddr(m)
}

/// Decode the op at the start of `b`: the action and its encoded length. `None` at the end.
#[inline]
fn decode(b: &[u8]) -> Option<(Action, usize)> {
    let op = *b.first()?;
    Some(match op {
        OP_DECAP => (Action::Decap, 1),
        OP_ROUTE => (Action::Route { mtu: u16_at(b, 1) }, 3),
        OP_NAT_SRC | OP_NAT_DST => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[1..17]);
            let side = if op == OP_NAT_SRC {
                NatSide::Source
            } else {
                NatSide::Destination
            };
            (
                Action::Nat {
                    side,
                    ip: IpAddr16(ip),
                    port: u16_at(b, 17),
                },
                19,
            )
        }
        OP_SET_MACS => (
            Action::SetMacs {
                src: mac_at(b, 1),
                dst: mac_at(b, 7),
            },
            13,
        ),
        OP_ENCAP4 | OP_ENCAP6 => {
            let (src_ip, dst_ip, at) = if op == OP_ENCAP4 {
                let s: [u8; 4] = b[13..17].try_into().expect("4 bytes");
                let d: [u8; 4] = b[17..21].try_into().expect("4 bytes");
                (IpAddr::from(s), IpAddr::from(d), 21)
            } else {
                let s: [u8; 16] = b[13..29].try_into().expect("16 bytes");
                let d: [u8; 16] = b[29..45].try_into().expect("16 bytes");
                (IpAddr::from(s), IpAddr::from(d), 45)
            };
            let vni = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], 0]);
            let e = VxlanOuter {
                src_mac: mac_at(b, 1),
                dst_mac: mac_at(b, 7),
                src_ip,
                dst_ip,
                src_port: u16_at(b, at),
                dst_port: u16_at(b, at + 2),
                vni: Vni::new(vni).expect("24 bits were encoded"),
                ttl: b[at + 7],
            };
            (Action::Encap(e), at + 8)
        }
        OP_OUTPUT => (Action::Output(PortId(u32_at(b, 1))), 5),
        OP_DROP => {
            let kind = DropKind::ALL[usize::from(b[1])];
            let (a, x) = (u32_at(b, 2), u32_at(b, 6));
            let r = match kind {
                DropKind::UnknownPort => DropReason::UnknownPort(PortId(a)),
                DropKind::UnknownVni => DropReason::UnknownVni(a),
                DropKind::UnsupportedEtherType => DropReason::UnsupportedEtherType(a as u16),
                DropKind::SecurityGroupDeny => DropReason::SecurityGroupDeny {
                    group: SecurityGroupId(a),
                    rule: x,
                },
                DropKind::PacketTooBig => DropReason::PacketTooBig { mtu: a as u16 },
                other => other
                    .payload_free_reason()
                    .expect("payload kinds handled above"),
            };
            (Action::Drop(r), 10)
        }
        _ => unreachable!("only encode() writes ops"),
    })
}

/// Apply `actions` to the frame in `pkt`, which `parsed` describes (offsets from the frame's
/// start as it is now). Returns the verdict. Never panics on a frame that parsed: every offset
/// used comes from the parse of this very frame.
#[inline]
pub fn apply(actions: &ActionList, pkt: &mut PacketBuf, parsed: &ParsedFrame) -> Verdict {
    // `cur` is the frame later actions address; `base` is its offset in the original frame.
    let mut cur: &Headers = &parsed.outer;
    let mut base = 0usize;
    let bytes = &actions.bytes[..usize::from(actions.len)];
    let mut at = 0usize;
    while at < bytes.len() {
        let Some((action, n)) = decode(&bytes[at..]) else {
            break;
        };
        at += n;
        match action {
            Action::Decap => {
                let (Some(vx), Some(inner)) = (parsed.vxlan.as_ref(), parsed.inner.as_ref()) else {
                    return Verdict::Drop(DropReason::PolicyDrop);
                };
                // The inner frame ends where the outer IP datagram ends; anything after that is
                // outer Ethernet padding and must not leak into the inner frame.
                let outer_end =
                    usize::from(parsed.outer.l3_offset) + usize::from(parsed.outer.l3_len);
                pkt.truncate(outer_end - base);
                let inner_off = usize::from(vx.inner_offset);
                if pkt.pull_front(inner_off - base).is_err() {
                    return Verdict::Drop(DropReason::PolicyDrop);
                }
                cur = inner;
                base = inner_off;
            }
            Action::Route { mtu } => {
                let gso = pkt.gso_size();
                if let Err(reason) = route(pkt.data_mut(), cur, base, mtu, gso) {
                    return Verdict::Drop(reason);
                }
            }
            Action::Nat { side, ip, port } => {
                if !rewrite_nat(pkt.data_mut(), cur, base, side, ip, port) {
                    return Verdict::Drop(DropReason::PolicyDrop);
                }
            }
            Action::SetMacs { src, dst } => {
                let d = pkt.data_mut();
                d[0..6].copy_from_slice(&dst.0);
                d[6..12].copy_from_slice(&src.0);
            }
            Action::Encap(e) => {
                let inner_len = pkt.len();
                let written = pkt
                    .push_front(e.header_len())
                    .ok()
                    .map(|h| e.write_header(h, inner_len));
                if !matches!(written, Some(Ok(_))) {
                    return Verdict::Drop(DropReason::PolicyDrop);
                }
            }
            Action::Output(port) => return Verdict::Forward(port),
            Action::Drop(reason) => return Verdict::Drop(reason),
        }
    }
    Verdict::Drop(DropReason::PolicyDrop)
}

/// The router's step for the IP packet `h` describes (at `h.l3_offset - base` in `frame`): refuse
/// it when its TTL / hop limit is spent (checked first, as Linux's `ip_forward` does) or it is
/// longer than `mtu`, else decrement the TTL / hop limit. A GSO super-frame (`gso` > 0) is
/// checked by the packets it will be cut into: its headers plus one segment.
fn route(frame: &mut [u8], h: &Headers, base: usize, mtu: u16, gso: u16) -> Result<(), DropReason> {
    let Some(key) = h.key else {
        return Err(DropReason::PolicyDrop);
    };
    let l3 = usize::from(h.l3_offset) - base;
    if h.ttl <= 1 {
        return Err(DropReason::TtlExpired);
    }
    let len = match gso {
        0 => h.l3_len,
        seg => (h.payload_offset - h.l3_offset)
            .saturating_add(seg)
            .min(h.l3_len),
    };
    if len > mtu {
        return Err(DropReason::PacketTooBig { mtu });
    }
    if key.src_ip.is_v4() {
        // TTL shares a 16-bit word with the protocol (RFC 1624 incremental update).
        let old = u16::from_be_bytes([frame[l3 + 8], frame[l3 + 9]]);
        frame[l3 + 8] = h.ttl - 1;
        let new = u16::from_be_bytes([frame[l3 + 8], frame[l3 + 9]]);
        let c = u16::from_be_bytes([frame[l3 + 10], frame[l3 + 11]]);
        frame[l3 + 10..l3 + 12].copy_from_slice(&checksum::update16(c, old, new).to_be_bytes());
    } else {
        frame[l3 + 7] = h.ttl - 1;
    }
    Ok(())
}

/// The SNAT of an ICMP error related to a translated connection (the outer address is already
/// rewritten): the packet it carries travelled the other way, so its *other* end gets the new
/// address and port (or query identifier), as nf_nat's `nf_nat_icmp_reply_translation` does.
/// The embedded IP checksum and the embedded UDP/TCP/ICMP checksum (when its bytes are there) are
/// updated incrementally; the error's own checksum is recomputed, since it covers all of them.
/// `l4` is the error's ICMP header and `end` the end of its datagram, both in `frame`.
fn rewrite_nat_embedded(
    frame: &mut [u8],
    l4: usize,
    end: usize,
    side: NatSide,
    new_ip: &[u8; 4],
    port: u16,
) -> bool {
    let Some(e) = icmp_error::embedded(false, &frame[l4..end]) else {
        return false;
    };
    let (eip, el4) = (l4 + e.ip_offset, l4 + e.l4_offset);
    let be = |f: &[u8], at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    let (addr_at, port_at) = match side {
        NatSide::Source => (eip + 16, el4 + 2),
        NatSide::Destination => (eip + 12, el4),
    };
    let mut old_ip = [0u8; 4];
    old_ip.copy_from_slice(&frame[addr_at..addr_at + 4]);
    frame[addr_at..addr_at + 4].copy_from_slice(new_ip);
    let c = checksum::update_bytes(be(frame, eip + 10), &old_ip, new_ip);
    frame[eip + 10..eip + 12].copy_from_slice(&c.to_be_bytes());
    match (e.key.proto, e.key.icmp_kind()) {
        (ip_proto::TCP | ip_proto::UDP, _) => {
            let old_port = be(frame, port_at);
            frame[port_at..port_at + 2].copy_from_slice(&port.to_be_bytes());
            let tcp = e.key.proto == ip_proto::TCP;
            let csum_at = el4 + if tcp { 16 } else { 6 };
            if csum_at + 2 <= end {
                let c = be(frame, csum_at);
                let c = if tcp {
                    checksum::update16(checksum::update_bytes(c, &old_ip, new_ip), old_port, port)
                } else {
                    checksum::update_udp_v4_16(
                        checksum::update_udp_v4_bytes(c, &old_ip, new_ip),
                        old_port,
                        port,
                    )
                };
                frame[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
            }
        }
        (_, Some(IcmpKind::Request | IcmpKind::Reply)) => {
            let old_id = be(frame, el4 + 4);
            frame[el4 + 4..el4 + 6].copy_from_slice(&port.to_be_bytes());
            let c = checksum::update16(be(frame, el4 + 2), old_id, port);
            frame[el4 + 2..el4 + 4].copy_from_slice(&c.to_be_bytes());
        }
        _ => {}
    }
    frame[l4 + 2..l4 + 4].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(&frame[l4..end]);
    frame[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
    true
}

/// Rewrite one end of an IPv4 TCP/UDP/ICMP-echo packet. Returns false when the packet is not one
/// (the slow path only builds NAT actions for those, so false means a mismatched entry).
#[inline]
fn rewrite_nat(
    frame: &mut [u8],
    h: &Headers,
    base: usize,
    side: NatSide,
    ip: IpAddr16,
    port: u16,
) -> bool {
    let (Some(key), Some(new_ip)) = (h.key.as_ref(), ip.v4_octets()) else {
        return false;
    };
    if !key.src_ip.is_v4() {
        return false;
    }
    let l3 = usize::from(h.l3_offset) - base;
    let l4 = usize::from(h.l4_offset) - base;
    let addr_at = l3 + if side == NatSide::Source { 12 } else { 16 };
    let mut old_ip = [0u8; 4];
    old_ip.copy_from_slice(&frame[addr_at..addr_at + 4]);
    frame[addr_at..addr_at + 4].copy_from_slice(&new_ip);
    let ip_csum = u16::from_be_bytes([frame[l3 + 10], frame[l3 + 11]]);
    let ip_csum = checksum::update_bytes(ip_csum, &old_ip, &new_ip);
    frame[l3 + 10..l3 + 12].copy_from_slice(&ip_csum.to_be_bytes());
    if h.fragment == Fragment::NonFirst {
        // A later fragment carries no transport header: its bytes are data. The first
        // fragment's incremental update already accounts for the new address and port, since
        // the transport checksum covers the whole datagram.
        return true;
    }
    match key.proto {
        ip_proto::TCP | ip_proto::UDP => {
            let port_at = l4 + if side == NatSide::Source { 0 } else { 2 };
            let csum_at = l4 + if key.proto == ip_proto::TCP { 16 } else { 6 };
            let old_port = u16::from_be_bytes([frame[port_at], frame[port_at + 1]]);
            frame[port_at..port_at + 2].copy_from_slice(&port.to_be_bytes());
            let c = u16::from_be_bytes([frame[csum_at], frame[csum_at + 1]]);
            let c = if key.proto == ip_proto::TCP {
                checksum::update16(checksum::update_bytes(c, &old_ip, &new_ip), old_port, port)
            } else {
                checksum::update_udp_v4_16(
                    checksum::update_udp_v4_bytes(c, &old_ip, &new_ip),
                    old_port,
                    port,
                )
            };
            frame[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
            true
        }
        ip_proto::ICMP if key.icmp_kind() == Some(IcmpKind::Error) => {
            let end = usize::from(h.l3_offset) + usize::from(h.l3_len) - base;
            rewrite_nat_embedded(frame, l4, end, side, &new_ip, port)
        }
        ip_proto::ICMP => {
            // Echo request/reply only; the identifier plays the port. ICMPv4 has no pseudo-header,
            // so only the identifier change enters its checksum.
            let id_at = l4 + 4;
            let old_id = u16::from_be_bytes([frame[id_at], frame[id_at + 1]]);
            frame[id_at..id_at + 2].copy_from_slice(&port.to_be_bytes());
            let c = u16::from_be_bytes([frame[l4 + 2], frame[l4 + 3]]);
            let c = checksum::update16(c, old_id, port);
            frame[l4 + 2..l4 + 4].copy_from_slice(&c.to_be_bytes());
            true
        }
        _ => false,
    }
}
