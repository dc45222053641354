//! Flow-entry actions and the executor that applies them to a frame.
//!
//! An [`ActionList`] is the header transformation of one unified flow entry: an ordered, bounded
//! list of [`Action`]s ending in `Output` or `Drop`. The slow path builds it; the fast path (and the
//! slow path, for the packet that caused it) runs [`apply`]. Because both paths run this one
//! function on the same list, they produce the same bytes and the same verdict by construction.
//!
//! Order matters and is fixed by the builder: `Decap` first (the rest then address the inner
//! frame), then NAT rewrites, then MAC rewrites, then `Encap`, then the terminal action.
//! Checksums are updated incrementally (RFC 1624); nothing here allocates.

use crate::ids::PortId;
use crate::packet::PacketBuf;
use crate::verdict::{DropReason, Verdict};
use spillway_wire::checksum;
use spillway_wire::build::VxlanOuter;
use spillway_wire::{Headers, IpAddr16, MacAddr, ParsedFrame, ip_proto};

/// Most actions a flow entry can hold. The longest list the slow path builds today is four
/// (Decap, NAT, SetMacs, Output); five leaves room without making entries much larger.
pub const ACTIONS_MAX: usize = 5;

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

/// Bounded, ordered action list; see the module doc for the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActionList {
    actions: [Action; ACTIONS_MAX],
    len: u8,
}

/// The list already holds [`ACTIONS_MAX`] actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("action list full: at most {ACTIONS_MAX} actions")]
pub struct ActionListFull;

impl Default for ActionList {
    fn default() -> Self {
        ActionList::new()
    }
}

impl ActionList {
    /// An empty list (applying it drops with `PolicyDrop`: a list must end in a terminal action).
    pub const fn new() -> ActionList {
        ActionList { actions: [Action::Drop(DropReason::PolicyDrop); ACTIONS_MAX], len: 0 }
    }

    /// A list that only drops.
    pub fn drop(reason: DropReason) -> ActionList {
        let mut l = ActionList::new();
        l.actions[0] = Action::Drop(reason);
        l.len = 1;
        l
    }

    /// Append an action.
    pub fn push(&mut self, a: Action) -> Result<(), ActionListFull> {
        let slot = self.actions.get_mut(self.len as usize).ok_or(ActionListFull)?;
        *slot = a;
        self.len += 1;
        Ok(())
    }

    /// The actions, in order.
    #[inline]
    pub fn as_slice(&self) -> &[Action] {
        &self.actions[..self.len as usize]
    }

    /// The output port, when the list ends in `Output`.
    pub fn output(&self) -> Option<PortId> {
        match self.as_slice().last() {
            Some(Action::Output(p)) => Some(*p),
            _ => None,
        }
    }
}

/// Apply `actions` to the frame in `pkt`, which `parsed` describes (offsets from the frame's
/// start as it is now). Returns the verdict. Never panics on a frame that parsed: every offset
/// used comes from the parse of this very frame.
#[inline]
pub fn apply(actions: &ActionList, pkt: &mut PacketBuf, parsed: &ParsedFrame) -> Verdict {
    // `cur` is the frame later actions address; `base` is its offset in the original frame.
    let mut cur: &Headers = &parsed.outer;
    let mut base = 0usize;
    for action in actions.as_slice() {
        match *action {
            Action::Decap => {
                let (Some(vx), Some(inner)) = (parsed.vxlan.as_ref(), parsed.inner.as_ref()) else {
                    return Verdict::Drop(DropReason::PolicyDrop);
                };
                // The inner frame ends where the outer IP datagram ends; anything after that is
                // outer Ethernet padding and must not leak into the inner frame.
                let outer_end = usize::from(parsed.outer.l3_offset) + usize::from(parsed.outer.l3_len);
                pkt.truncate(outer_end - base);
                let inner_off = usize::from(vx.inner_offset);
                if pkt.pull_front(inner_off - base).is_err() {
                    return Verdict::Drop(DropReason::PolicyDrop);
                }
                cur = inner;
                base = inner_off;
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
                let written = pkt.push_front(e.header_len()).ok().map(|h| e.write_header(h, inner_len));
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
