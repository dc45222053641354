//! The neighbour responder: ARP (RFC 826) and IPv6 neighbour discovery (RFC 4861) for VM
//! ports, so that a guest configured with only an address and a default route can talk.
//!
//! The vSwitch routes: every frame a VM sends goes to its tenant's router MAC, and the
//! pipeline forwards by IP. So a guest never needs another guest's MAC, only the router's,
//! and the responder answers every resolution it should answer with the tenant's
//! `router_mac`, rewriting the request in place into the reply, which goes back out of the
//! port it came in on (`Verdict::Forward(ingress)`). Nothing here installs a flow entry,
//! touches conntrack or allocates; ARP and ND frames are never forwarded to another port.
//!
//! # What is answered
//!
//! An ARP request or Neighbor Solicitation from port P of tenant T for target X is answered
//! when X is not one of P's own addresses and X is
//! - one of T's router addresses ([`crate::policy::Tenant::router_ips`]: configured, or the
//!   first host of each subnet), or, for IPv6, the router's link-local address
//!   `fe80::` + modified EUI-64 of `router_mac` (RFC 4291 appendix A), which is the next hop of
//!   a guest's default route learned from a router or set by hand; or
//! - inside one of T's subnets and somewhere the pipeline can deliver: another VM port of T
//!   (proxy, so on-link peers resolve), or a more-specific tunnel route.
//!
//! A guest's own address is never answered: IPv6 duplicate address detection (a solicitation
//! from `::`, RFC 4862 section 5.4) and ARP probes (sender 0.0.0.0, RFC 5227 section 2.1.1) for
//! it must meet silence, or the guest would give its address up. Addresses outside T's subnets
//! (they are reached through the default route, not on-link), unassigned addresses (the
//! guest then reports "host unreachable" as on a LAN, instead of sending into a counted
//! `no_such_vm`) and other tenants' addresses are not answered.
//!
//! A solicitation from `::` (DAD) for an address the responder answers for gets a
//! Neighbor Advertisement to all-nodes (RFC 4861 section 7.2.4), so that the guest's DAD fails
//! as it would on a LAN where the address is taken. Advertisements carry the router flag and
//! the override flag: every answer is the router's, and no other node on this link can hold
//! the address (the proxy rule of section 7.2.8, override off, exists so that a real owner's
//! advertisement wins; here there is none, and a stale entry must be corrected).
//!
//! # What is consumed (counted, not answered: [`DropReason::NeighConsumed`])
//!
//! - Announcements of the port's own address: gratuitous ARP (RFC 5227 section 3), ARP
//!   replies, unsolicited Neighbor Advertisements (RFC 4861 section 7.2.6). One claiming an
//!   address that is not the port's is dropped as [`DropReason::SpoofedIp`]; one carrying
//!   another MAC as [`DropReason::SpoofedMac`].
//! - Probes and DAD for the port's own address; requests nobody answers for.
//! - Router Solicitations: no Router Advertisement is sent. A guest with an address and a
//!   default route (via the router's global or link-local address) needs only neighbour
//!   advertisements; advertising prefixes would turn on address autoconfiguration and default
//!   routes in every guest, which is a policy of its own.
//! - Router Advertisements and redirects from a VM: a VM is not a router (RA guard, RFC 6105).
//! - MLD queries, reports and dones (RFC 2710, RFC 3810): the vSwitch forwards no multicast.
//!
//! # What is dropped as malformed ([`DropReason::NeighMalformed`])
//!
//! ND with a hop limit other than 255, a bad ICMPv6 checksum, a non-zero code, a short
//! message, a zero-length or overrunning option, a multicast target, a DAD solicitation not
//! sent to the solicited-node address or carrying a source link-layer option (RFC 4861 sections
//! 6.1.1, 7.1.1, 7.1.2, 8.1), a multicast advertisement with the solicited flag, and ND in IPv6
//! fragments (RFC 6980 section 5). MLD with a bad checksum or shorter than its fixed part. ARP
//! that fails its format check never gets here: the parser rejects it (`vswitch.drop.malformed`).
//!
//! The uplink is not served: ARP there is the host's (`arp_not_routed`), and ND arriving over
//! the overlay stays `icmp_untracked`.

use spillway_wire::arp::{self, ArpRepr};
use spillway_wire::nd::{self, NdKind, NeighborOp, NeighborRepr};
use spillway_wire::{Fragment, Headers, IpAddr16, L3, MacAddr, ParsedFrame, checksum, ip_proto};

use crate::ids::PortId;
use crate::packet::PacketBuf;
use crate::policy::{Policy, RouteTarget, Tenant, VmPort};
use crate::verdict::{DropReason, Verdict};

crate::counters! {
    /// Responder counters (dotted names in [`NeighCounters::iter`]). Every frame the responder
    /// takes is counted once here or under a drop reason (malformed, spoofed, unknown port).
    #[derive(PartialEq, Eq)]
    pub struct NeighCounters {
        /// ARP requests answered.
        arp_reply => "vswitch.neigh.arp_reply",
        /// Neighbor Solicitations answered.
        na_reply => "vswitch.neigh.na_reply",
        /// Frames taken without a reply (the sum of the next six).
        consumed => "vswitch.neigh.consumed",
        /// Gratuitous ARP, ARP replies and unsolicited NAs for the port's own addresses.
        announce => "vswitch.neigh.announce",
        /// Requests, probes and DAD for the asker's own address.
        own_target => "vswitch.neigh.own_target",
        /// Requests for addresses the responder does not answer for.
        unanswered => "vswitch.neigh.unanswered",
        /// Router Solicitations (no advertisement is sent).
        router_solicit => "vswitch.neigh.router_solicit",
        /// Router Advertisements and redirects sent by a VM.
        router_msg => "vswitch.neigh.router_msg",
        /// MLD queries, reports and dones.
        mld => "vswitch.neigh.mld",
    }
}

impl NeighCounters {
    fn consume(&mut self, which: fn(&mut NeighCounters) -> &mut u64) -> Verdict {
        *which(self) += 1;
        self.consumed += 1;
        Verdict::Drop(DropReason::NeighConsumed)
    }
}

/// Whether the responder takes a frame from a VM port: ARP, or ICMPv6 neighbour discovery or
/// MLD (the ICMPv6 type is the high byte of the key's destination port). Non-first fragments
/// carry no type and are not claimed.
#[inline]
pub fn claims(parsed: &ParsedFrame) -> bool {
    let h = &parsed.outer;
    match (h.l3, h.key) {
        (L3::Arp, _) => true,
        (L3::Ipv6, Some(k)) => {
            k.proto == ip_proto::ICMPV6 && nd::kind((k.dst_port >> 8) as u8).is_some()
        }
        _ => false,
    }
}

/// Answers or consumes a frame [`claims`] took, from VM port `ingress`: on an answer `pkt` is
/// rewritten into the reply and the verdict is `Forward(ingress)`.
pub fn respond(
    policy: &Policy,
    ingress: PortId,
    pkt: &mut PacketBuf,
    parsed: &ParsedFrame,
    c: &mut NeighCounters,
) -> Verdict {
    let Some(port) = policy.port(ingress) else {
        return Verdict::Drop(DropReason::UnknownPort(ingress));
    };
    let Some(tenant) = policy.tenant(port.tenant) else {
        return Verdict::Drop(DropReason::PolicyDrop);
    };
    let h = &parsed.outer;
    let r = match h.l3 {
        L3::Arp => arp_request(policy, tenant, port, pkt, h, c),
        _ => neighbor_discovery(policy, tenant, port, pkt, h, c),
    };
    match r {
        Ok(v) => v,
        Err(reason) => Verdict::Drop(reason),
    }
}

/// Whether the responder answers for `target` in `tenant` (see the module doc); the caller has
/// already excluded the asker's own addresses.
fn answers(policy: &Policy, tenant: &Tenant, target: IpAddr16) -> bool {
    if tenant.router_ips.contains(&target) || target.0 == nd::link_local_of(tenant.router_mac) {
        return true;
    }
    if !tenant.subnets.iter().any(|s| s.contains(target)) {
        return false;
    }
    match policy.route(tenant.id, target) {
        Some(RouteTarget::Local) => policy.port_by_ip(tenant.id, target).is_some(),
        Some(RouteTarget::Tunnel { .. }) => true,
        Some(RouteTarget::Internet | RouteTarget::Blackhole) | None => false,
    }
}

/// ARP from a VM (RFC 826, with RFC 5227's probes and announcements).
fn arp_request(
    policy: &Policy,
    tenant: &Tenant,
    port: &VmPort,
    pkt: &mut PacketBuf,
    h: &Headers,
    c: &mut NeighCounters,
) -> Result<Verdict, DropReason> {
    let l3 = usize::from(h.l3_offset);
    let a = pkt
        .data()
        .get(l3..)
        .ok_or(DropReason::NeighMalformed)
        .and_then(|b| ArpRepr::parse(b).map_err(DropReason::Malformed))?;
    if h.src_mac != port.mac || a.sender_mac != port.mac {
        return Err(DropReason::SpoofedMac);
    }
    let sender = IpAddr16::from_v4(a.sender_ip);
    let target = IpAddr16::from_v4(a.target_ip);
    // RFC 5227 section 2.1.1: a probe has sender address 0.0.0.0, since the prober does not
    // own its candidate address yet; any other sender address must be the port's.
    let probe = a.sender_ip == [0; 4];
    if !probe && !port.ips.contains(&sender) {
        return Err(DropReason::SpoofedIp);
    }
    // An ARP reply nobody asked for (we never forward requests to VMs), or a request whose
    // sender and target are the same address (RFC 5227 section 3, an announcement): the port
    // telling the link about its own address.
    if a.operation == arp::OP_REPLY || (!probe && a.sender_ip == a.target_ip) {
        return Ok(c.consume(|c| &mut c.announce));
    }
    if port.ips.contains(&target) {
        return Ok(c.consume(|c| &mut c.own_target));
    }
    if !answers(policy, tenant, target) {
        return Ok(c.consume(|c| &mut c.unanswered));
    }
    // RFC 826 "Packet Reception": swap the sender and target fields, put the local hardware
    // address in the sender's, set the opcode to reply, send it to the asker.
    let reply = ArpRepr {
        operation: arp::OP_REPLY,
        sender_mac: tenant.router_mac,
        sender_ip: a.target_ip,
        target_mac: a.sender_mac,
        target_ip: a.sender_ip,
    };
    pkt.set_len(l3 + arp::PACKET_LEN)
        .map_err(|_| DropReason::NeighMalformed)?;
    let data = pkt.data_mut();
    set_macs(data, port.mac, tenant.router_mac);
    reply.emit(&mut data[l3..]).map_err(DropReason::Malformed)?;
    pkt.mark_generated();
    c.arp_reply += 1;
    Ok(Verdict::Forward(port.id))
}

/// ICMPv6 neighbour discovery and MLD from a VM (RFC 4861, RFC 2710, RFC 3810).
fn neighbor_discovery(
    policy: &Policy,
    tenant: &Tenant,
    port: &VmPort,
    pkt: &mut PacketBuf,
    h: &Headers,
    c: &mut NeighCounters,
) -> Result<Verdict, DropReason> {
    let malformed = DropReason::NeighMalformed;
    let key = h.key.ok_or(malformed)?;
    // RFC 6980 section 5: ND must not be fragmented, and a receiver drops fragmented ND.
    if h.fragment != Fragment::None {
        return Err(malformed);
    }
    if h.src_mac != port.mac {
        return Err(DropReason::SpoofedMac);
    }
    let (src, dst) = (key.src_ip.0, key.dst_ip.0);
    let end = usize::from(h.l3_offset) + usize::from(h.l3_len);
    let msg = pkt
        .data()
        .get(usize::from(h.l4_offset)..end)
        .ok_or(malformed)?;
    // RFC 4443 section 2.3 (and RFC 4861 section 7.1.1: "the ICMP checksum is valid").
    if !checksum::verify_l4_v6(&src, &dst, ip_proto::ICMPV6, msg) {
        return Err(malformed);
    }
    let Some(kind) = msg.first().and_then(|&t| nd::kind(t)) else {
        return Err(malformed);
    };
    // RFC 4861 sections 6.1.1, 6.1.2, 7.1.1, 7.1.2, 8.1: hop limit 255 proves the message was
    // sent on this link, not forwarded by a router. (MLD is sent with hop limit 1.)
    if kind != NdKind::Mld && h.ttl != nd::HOP_LIMIT {
        return Err(malformed);
    }
    // The sender is the port, speaking from one of its addresses, its link-local address
    // (which is the guest's to choose, RFC 7217) or, for DAD and RS, the unspecified address.
    // IPv4-mapped addresses (`::ffff:0:0/96`) are never on an IPv6 link; in `IpAddr16` they
    // would alias the port's IPv4 addresses, so they are nobody's here.
    let own = |a: &[u8; 16]| {
        let ip = IpAddr16(*a);
        !ip.is_v4() && (port.ips.contains(&ip) || nd::is_link_local(a))
    };
    let unspecified = src == [0; 16];
    match kind {
        NdKind::Mld => {
            // RFC 2710 section 3 / RFC 3810 section 5: a query or report has at least 24 (v1)
            // or 8 (v2 report) bytes; nothing else of it matters to a switch that does no
            // multicast.
            let min = if msg[0] == nd::MLD_REPORT_V2 { 8 } else { 24 };
            if msg.len() < min {
                return Err(malformed);
            }
            Ok(c.consume(|c| &mut c.mld))
        }
        NdKind::RouterSolicit => {
            // RFC 4861 section 6.1.1: code 0, 8 or more bytes.
            if msg.len() < 8 || msg[1] != 0 {
                return Err(malformed);
            }
            if !unspecified && !own(&src) {
                return Err(DropReason::SpoofedIp);
            }
            Ok(c.consume(|c| &mut c.router_solicit))
        }
        NdKind::RouterAdvert | NdKind::Redirect => Ok(c.consume(|c| &mut c.router_msg)),
        NdKind::NeighborAdvert => {
            let na = NeighborRepr::parse(msg).map_err(|_| malformed)?;
            // RFC 4861 section 7.1.2: a multicast advertisement is never solicited.
            if nd::is_multicast(&dst) && na.flags & nd::FLAG_SOLICITED != 0 {
                return Err(malformed);
            }
            if !own(&src) || !own(&na.target) {
                return Err(DropReason::SpoofedIp);
            }
            if na.lla.is_some_and(|m| m != port.mac) {
                return Err(DropReason::SpoofedMac);
            }
            Ok(c.consume(|c| &mut c.announce))
        }
        NdKind::NeighborSolicit => {
            let ns = NeighborRepr::parse(msg).map_err(|_| malformed)?;
            debug_assert_eq!(ns.op, NeighborOp::Solicit);
            if unspecified {
                // RFC 4861 section 7.1.1: DAD goes to the target's solicited-node address and
                // carries no source link-layer address.
                if dst != nd::solicited_node(&ns.target) || ns.lla.is_some() {
                    return Err(malformed);
                }
            } else if !own(&src) {
                return Err(DropReason::SpoofedIp);
            }
            if ns.lla.is_some_and(|m| m != port.mac) {
                return Err(DropReason::SpoofedMac);
            }
            let target = IpAddr16(ns.target);
            if target.is_v4() {
                return Ok(c.consume(|c| &mut c.unanswered));
            }
            if port.ips.contains(&target) {
                return Ok(c.consume(|c| &mut c.own_target));
            }
            if !answers(policy, tenant, target) {
                return Ok(c.consume(|c| &mut c.unanswered));
            }
            // RFC 4861 section 7.2.4: a solicitation from `::` is answered to all-nodes, not
            // solicited; any other to its source, solicited.
            let (to_ip, to_mac, solicited) = if unspecified {
                (nd::ALL_NODES, nd::multicast_mac(&nd::ALL_NODES), 0)
            } else {
                (src, port.mac, nd::FLAG_SOLICITED)
            };
            let na = NeighborRepr {
                op: NeighborOp::Advert,
                flags: nd::FLAG_ROUTER | nd::FLAG_OVERRIDE | solicited,
                target: ns.target,
                lla: Some(tenant.router_mac),
            };
            write_advert(pkt, h, tenant.router_mac, to_mac, &ns.target, &to_ip, &na)?;
            pkt.mark_generated();
            c.na_reply += 1;
            Ok(Verdict::Forward(port.id))
        }
    }
}

/// Rewrites `pkt` into an NA from `from_ip` (the target it answers for) at `router` to `to_ip`
/// at `to_mac`, keeping the Ethernet header's VLAN tags and dropping any extension headers.
fn write_advert(
    pkt: &mut PacketBuf,
    h: &Headers,
    router: MacAddr,
    to_mac: MacAddr,
    from_ip: &[u8; 16],
    to_ip: &[u8; 16],
    na: &NeighborRepr,
) -> Result<(), DropReason> {
    let l3 = usize::from(h.l3_offset);
    let len = na.buffer_len();
    pkt.set_len(l3 + 40 + len)
        .map_err(|_| DropReason::NeighMalformed)?;
    let data = pkt.data_mut();
    set_macs(data, to_mac, router);
    let ip = &mut data[l3..l3 + 40];
    // Version 6, traffic class 0, flow label 0 (RFC 8200 section 3).
    ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&(len as u16).to_be_bytes());
    ip[6] = ip_proto::ICMPV6;
    ip[7] = nd::HOP_LIMIT;
    ip[8..24].copy_from_slice(from_ip);
    ip[24..40].copy_from_slice(to_ip);
    na.emit(from_ip, to_ip, &mut data[l3 + 40..])
        .map_err(DropReason::Malformed)?;
    Ok(())
}

fn set_macs(frame: &mut [u8], dst: MacAddr, src: MacAddr) {
    frame[..6].copy_from_slice(&dst.0);
    frame[6..12].copy_from_slice(&src.0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_wire::build::FrameBuilder;
    use spillway_wire::{ParseOptions, parse_frame};

    fn parsed(f: &[u8]) -> ParsedFrame {
        parse_frame(f, &ParseOptions::default()).expect("valid frame")
    }

    #[test]
    fn claims_arp_nd_and_mld_only() {
        let b = || FrameBuilder::new().eth(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr::BROADCAST);
        let arp = b()
            .arp(1, [10, 0, 0, 1], MacAddr::ZERO, [10, 0, 0, 2])
            .build();
        assert!(claims(&parsed(&arp)));
        let v6 = |t: u8| {
            b().ipv6(
                "fe80::1".parse::<core::net::Ipv6Addr>().unwrap(),
                "ff02::1".parse::<core::net::Ipv6Addr>().unwrap(),
            )
            .icmp(t, 0)
            .build()
        };
        for t in [130, 131, 132, 133, 134, 135, 136, 137, 143] {
            assert!(claims(&parsed(&v6(t))), "type {t}");
        }
        for t in [1, 128, 129, 141, 200] {
            assert!(!claims(&parsed(&v6(t))), "type {t}");
        }
        let echo = b()
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2])
            .icmp_echo(1, 1, false)
            .build();
        assert!(!claims(&parsed(&echo)));
    }

    #[test]
    fn consuming_counts_the_cause_and_the_total() {
        let mut c = NeighCounters::default();
        assert_eq!(
            c.consume(|c| &mut c.mld),
            Verdict::Drop(DropReason::NeighConsumed)
        );
        c.consume(|c| &mut c.announce);
        assert_eq!((c.mld, c.announce, c.consumed), (1, 1, 2));
        let names: Vec<_> = c.iter().map(|(n, _)| n).collect();
        assert!(names.iter().all(|n| n.starts_with("vswitch.neigh.")));
        assert_eq!(names.len(), 9);
    }
}
