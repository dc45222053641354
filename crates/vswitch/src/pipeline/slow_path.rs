//! The slow path: what happens to a frame no usable flow entry handled. Neighbour discovery is
//! answered, fragments are tracked, and everything else walks the policy (anti-spoof,
//! conntrack, security groups, route, SNAT) to find or create its connection, whose flow entries
//! are then installed (see [`super::entries`]) and applied to the frame.

use spillway_wire::icmp::IcmpKind;
use spillway_wire::{FlowKey, Fragment, Headers, IpAddr16, ParsedFrame};

use super::entries::{reply_key, tag_vtep, vtep_tag};
use super::snat::nat_of_reply;
use super::{FragFollow, Pipeline, Shape, tcp_flags};
use crate::action::apply;
use crate::conntrack::{CtDir, CtError, CtHandle};
use crate::flow::FlowEntry;
use crate::frag::{FragDrop, FragKey, FragPiece, FragZone};
use crate::ids::{Direction, PortId, TenantId};
use crate::neigh;
use crate::packet::PacketBuf;
use crate::policy::RouteTarget;
use crate::time::Instant;
use crate::verdict::{DropReason, Verdict};

impl Pipeline {
    /// The slow path: decide, install, apply.
    pub(super) fn slow_path(
        &mut self,
        now: Instant,
        ingress: PortId,
        pkt: &mut PacketBuf,
        parsed: &ParsedFrame,
    ) -> Verdict {
        self.counters.slow_path_packets += 1;
        // ARP and ND from a VM are answered (or consumed) here, never routed: see `neigh`.
        // Fragmented ND is the responder's to refuse (RFC 6980), so it goes first.
        if ingress != self.policy.host().uplink_port && neigh::claims(parsed) {
            return neigh::respond(&self.policy, ingress, pkt, parsed, &mut self.neigh);
        }
        let frag = match self.fragment_of(ingress, parsed) {
            Ok(f) => f,
            Err(reason) => return Verdict::Drop(reason),
        };
        if let Some((key, piece, false)) = frag {
            return match self.frags.follow(now, key, piece) {
                Ok(f) if f.src_mac.is_some_and(|m| m != parsed.outer.src_mac) => {
                    Verdict::Drop(DropReason::SpoofedMac)
                }
                Ok(f) => apply(&f.actions, pkt, parsed),
                Err(d) => Verdict::Drop(frag_drop(d)),
            };
        }
        match self.decide(now, ingress, pkt.data(), parsed) {
            Err(reason) => Verdict::Drop(reason),
            Ok(entry) => {
                if let Some((key, piece, true)) = frag {
                    let follow = FragFollow {
                        actions: entry.actions,
                        src_mac: (ingress != self.policy.host().uplink_port)
                            .then_some(parsed.outer.src_mac),
                    };
                    if let Err(d) = self.frags.track_first(now, key, piece, follow) {
                        return Verdict::Drop(frag_drop(d));
                    }
                }
                apply(&entry.actions, pkt, parsed)
            }
        }
    }

    /// The datagram a fragment belongs to, its piece, and whether it is the first fragment;
    /// `None` for a packet that is not a fragment. Outer fragments on the uplink addressed to
    /// our VTEP are fragmented VXLAN, which is not reassembled: dropped as `Fragment` (the
    /// underlay MTU is sized for the overlay, so a sender that fragments VXLAN is misconfigured).
    /// Outer fragments to a SNAT address are tracked like a VM's.
    fn fragment_of(
        &self,
        ingress: PortId,
        parsed: &ParsedFrame,
    ) -> Result<Option<(FragKey, FragPiece, bool)>, DropReason> {
        let outer = &parsed.outer;
        let (h, vni) = match (parsed.vxlan.as_ref(), parsed.inner.as_ref()) {
            (Some(vx), Some(inner)) => (inner, Some(vx.vni.get())),
            _ => (outer, None),
        };
        if h.fragment == Fragment::None {
            return Ok(None);
        }
        let Some(key) = h.key else { return Ok(None) };
        if ingress == self.policy.host().uplink_port
            && vni.is_none()
            && key.dst_ip == self.policy.host().vtep_ip
        {
            return Err(DropReason::Fragment);
        }
        let (start, end) = h.frag.byte_range(h);
        Ok(Some((
            FragKey {
                zone: FragZone { port: ingress, vni },
                src: key.src_ip,
                dst: key.dst_ip,
                // RFC 8200 section 4.5 identifies an IPv6 datagram without its protocol.
                proto: if key.src_ip.is_v4() { key.proto } else { 0 },
                id: h.frag.id,
            },
            FragPiece {
                start,
                end,
                more: h.frag.more,
            },
            h.fragment == Fragment::First,
        )))
    }

    /// Walk the policy for one packet; on success install the connection's entries and return
    /// the entry for this packet's direction.
    fn decide(
        &mut self,
        now: Instant,
        ingress: PortId,
        frame: &[u8],
        parsed: &ParsedFrame,
    ) -> Result<FlowEntry, DropReason> {
        let host = *self.policy.host();
        if ingress == host.uplink_port {
            return self.decide_uplink(now, frame, parsed);
        }
        let port = self
            .policy
            .port(ingress)
            .ok_or(DropReason::UnknownPort(ingress))?;
        let h = &parsed.outer;
        let key = l3_key(h)?;
        if h.src_mac != port.mac {
            return Err(DropReason::SpoofedMac);
        }
        if !port.ips.contains(&key.src_ip) {
            return Err(DropReason::SpoofedIp);
        }
        let tenant = port.tenant;
        let flags = tcp_flags(h);
        if let Some((handle, dir)) = self.ct.lookup(now, tenant, &key) {
            return self.existing(now, tenant, handle, dir, flags, None);
        }
        if key.icmp_kind() == Some(IcmpKind::Error) {
            return self.related(now, tenant, &key, h, frame, None);
        }
        opens_connection(&key)?;
        // A new connection from a VM.
        if let Some(reason) = self
            .policy
            .sg_evaluate(ingress, Direction::Egress, &key)
            .drop_reason()
        {
            return Err(reason);
        }
        let shape = match self.policy.route(tenant, key.dst_ip) {
            None => return Err(DropReason::NoRoute),
            Some(RouteTarget::Blackhole) => return Err(DropReason::Blackhole),
            Some(RouteTarget::Local) => Shape::Local {
                a: ingress,
                b: self.admit_local(tenant, &key)?,
            },
            Some(RouteTarget::Tunnel { vtep }) => Shape::TunnelOut { a: ingress, vtep },
            Some(RouteTarget::Internet) => Shape::Internet {
                a: ingress,
                nat: self.snat.allocate(&self.policy, tenant, &key)?,
            },
        };
        let reply = reply_key(&key, shape);
        let (policy, snat) = (&self.policy, &mut self.snat);
        let created = self.ct.create(now, tenant, key, reply, flags, 0, |c| {
            snat.release_conn(policy, c)
        });
        let handle = match created {
            Ok(h) => h,
            Err(e) => {
                self.snat.release(tenant, &key, shape);
                return Err(ct_create_drop(e));
            }
        };
        self.counters.new_connections += 1;
        self.install(now, tenant, handle, CtDir::Original, &key, shape)
    }

    /// The local VM port a new connection is addressed to, if the destination exists in the
    /// tenant and that port's ingress security groups admit the connection.
    fn admit_local(&self, tenant: TenantId, key: &FlowKey) -> Result<PortId, DropReason> {
        let b = self
            .policy
            .port_by_ip(tenant, key.dst_ip)
            .ok_or(DropReason::NoSuchVm)?;
        match self
            .policy
            .sg_evaluate(b, Direction::Ingress, key)
            .drop_reason()
        {
            Some(reason) => Err(reason),
            None => Ok(b),
        }
    }

    /// A frame on the uplink: VXLAN to our VTEP, or return traffic to a SNAT address.
    fn decide_uplink(
        &mut self,
        now: Instant,
        frame: &[u8],
        parsed: &ParsedFrame,
    ) -> Result<FlowEntry, DropReason> {
        let host = *self.policy.host();
        let outer = &parsed.outer;
        let outer_key = l3_key(outer)?;
        if let (Some(vx), Some(inner)) = (parsed.vxlan.as_ref(), parsed.inner.as_ref()) {
            if outer_key.dst_ip != host.vtep_ip {
                return Err(DropReason::NotForUs);
            }
            let tenant = self
                .policy
                .tenant_by_vni(vx.vni)
                .ok_or(DropReason::UnknownVni(vx.vni.get()))?;
            let key = l3_key(inner)?;
            let flags = tcp_flags(inner);
            if let Some((handle, dir)) = self.ct.lookup(now, tenant, &key) {
                return self.existing(now, tenant, handle, dir, flags, Some(outer_key.src_ip));
            }
            if key.icmp_kind() == Some(IcmpKind::Error) {
                return self.related(now, tenant, &key, inner, frame, Some(outer_key.src_ip));
            }
            opens_connection(&key)?;
            let b = self.admit_local(tenant, &key)?;
            let shape = Shape::TunnelIn {
                b,
                vtep: outer_key.src_ip,
            };
            let (policy, snat) = (&self.policy, &mut self.snat);
            let handle = self.ct.create(
                now,
                tenant,
                key,
                key.reversed(),
                flags,
                vtep_tag(outer_key.src_ip),
                |c| snat.release_conn(policy, c),
            );
            let handle = handle.map_err(ct_create_drop)?;
            self.counters.new_connections += 1;
            return self.install(now, tenant, handle, CtDir::Original, &key, shape);
        }
        // Plain IP on the uplink: only return traffic of SNATed connections is ours.
        let tenant = self
            .policy
            .is_snat_address(outer_key.dst_ip)
            .ok_or(DropReason::NotForUs)?;
        match self.ct.lookup(now, tenant, &outer_key) {
            Some((handle, dir)) => self.existing(now, tenant, handle, dir, tcp_flags(outer), None),
            None if outer_key.icmp_kind() == Some(IcmpKind::Error) => {
                self.related(now, tenant, &outer_key, outer, frame, None)
            }
            None => Err(opens_connection(&outer_key)
                .err()
                .unwrap_or(DropReason::NoConnection)),
        }
    }

    /// An ICMP error (`key`, headers `h` within `frame`) that matched no connection itself: as
    /// nf_conntrack's `nf_conntrack_inet_error`, it is *related* to the connection a reply to
    /// the packet it carries would belong to, if that connection is live and the error is
    /// addressed to the embedded packet's sender; it then takes that direction's entry (routes,
    /// MACs, encapsulation, and SNAT, which `Action::Nat` applies to the embedded header too)
    /// without stepping the connection or passing the security groups. Anything else is dropped
    /// as `IcmpErrorUnrelated`. Nothing is installed: errors always take the slow path.
    fn related(
        &mut self,
        now: Instant,
        tenant: TenantId,
        key: &FlowKey,
        h: &Headers,
        frame: &[u8],
        learned_vtep: Option<IpAddr16>,
    ) -> Result<FlowEntry, DropReason> {
        let unrelated = DropReason::IcmpErrorUnrelated;
        let end = usize::from(h.l3_offset) + usize::from(h.l3_len);
        let msg = frame.get(usize::from(h.l4_offset)..end).ok_or(unrelated)?;
        let e = spillway_wire::icmp_error::embedded(!key.src_ip.is_v4(), msg).ok_or(unrelated)?;
        let (handle, dir) = self
            .ct
            .lookup(now, tenant, &e.key.reversed())
            .ok_or(unrelated)?;
        let conn = self.ct.get(handle).ok_or(unrelated)?;
        if conn.tuple(dir).dst_ip != key.dst_ip {
            return Err(unrelated);
        }
        self.recheck(tenant, handle, learned_vtep, dir)?;
        let conn = self.ct.get(handle).ok_or(unrelated)?;
        let (orig, reply, tag) = (conn.orig(), conn.reply(), conn.tag());
        let shape = self.shape_of(tenant, &orig, &reply, tag, learned_vtep, dir)?;
        let (fwd, rev) = self.build_entries(tenant, handle, &orig, shape)?;
        self.counters.icmp_related += 1;
        Ok(match dir {
            CtDir::Original => fwd.1,
            CtDir::Reply => rev.1,
        })
    }

    /// A packet of an existing connection whose flow entry was missing or stale: step conntrack,
    /// rebuild the entries under the current policy (no security-group re-evaluation, unless the
    /// tenant rechecks connections on policy changes).
    #[allow(clippy::too_many_arguments)]
    fn existing(
        &mut self,
        now: Instant,
        tenant: TenantId,
        handle: CtHandle,
        dir: CtDir,
        flags: u8,
        learned_vtep: Option<IpAddr16>,
    ) -> Result<FlowEntry, DropReason> {
        self.recheck(tenant, handle, learned_vtep, dir)?;
        match self.ct.update(now, handle, dir, flags, 0) {
            Ok(_) => {}
            Err(CtError::Invalid) => return Err(DropReason::ConntrackInvalid),
            Err(_) => return Err(DropReason::NoConnection),
        }
        let conn = self.ct.get(handle).ok_or(DropReason::NoConnection)?;
        let (orig, reply, tag) = (conn.orig(), conn.reply(), conn.tag());
        let shape = self.shape_of(tenant, &orig, &reply, tag, learned_vtep, dir)?;
        let entry = self.install(now, tenant, handle, dir, &orig, shape)?;
        debug_assert!(entry.ct == Some((handle, dir)));
        Ok(entry)
    }

    /// Recover a connection's shape from its tuples and the current policy.
    pub(super) fn shape_of(
        &self,
        tenant: TenantId,
        orig: &FlowKey,
        reply: &FlowKey,
        tag: u64,
        learned_vtep: Option<IpAddr16>,
        dir: CtDir,
    ) -> Result<Shape, DropReason> {
        if let Some(a) = self.policy.port_by_ip(tenant, orig.src_ip) {
            return match self.policy.route(tenant, orig.dst_ip) {
                None => Err(DropReason::NoRoute),
                Some(RouteTarget::Blackhole) => Err(DropReason::Blackhole),
                Some(RouteTarget::Local) => {
                    let b = self
                        .policy
                        .port_by_ip(tenant, orig.dst_ip)
                        .ok_or(DropReason::NoSuchVm)?;
                    Ok(Shape::Local { a, b })
                }
                Some(RouteTarget::Tunnel { vtep }) => Ok(Shape::TunnelOut { a, vtep }),
                Some(RouteTarget::Internet) => {
                    let nat = (reply.dst_ip != orig.src_ip).then(|| nat_of_reply(reply));
                    Ok(Shape::Internet { a, nat })
                }
            };
        }
        let b = self
            .policy
            .port_by_ip(tenant, orig.dst_ip)
            .ok_or(DropReason::NoSuchVm)?;
        let vtep = match (tag_vtep(tag), learned_vtep, dir) {
            (Some(v), _, _) => v,
            (None, Some(v), CtDir::Original) => v,
            _ => match self.policy.route(tenant, orig.src_ip) {
                Some(RouteTarget::Tunnel { vtep }) => vtep,
                _ => return Err(DropReason::NoRoute),
            },
        };
        Ok(Shape::TunnelIn { b, vtep })
    }
}

/// Whether a packet that matched no connection may open one, and if not, why it is dropped:
/// as in nf_conntrack, an ICMP reply that answers no tracked request, an ICMP error (here it
/// could not be matched to a connection as related) and any other ICMP message that is not a
/// query are invalid, and never reach the security groups.
fn opens_connection(key: &FlowKey) -> Result<(), DropReason> {
    match key.icmp_kind() {
        None | Some(IcmpKind::Request) => Ok(()),
        Some(IcmpKind::Reply) => Err(DropReason::IcmpUnsolicitedReply),
        Some(IcmpKind::Error) => Err(DropReason::IcmpErrorUnrelated),
        Some(IcmpKind::Other) => Err(DropReason::IcmpUntracked),
    }
}

/// The 5-tuple of an IP frame; non-IP frames and fragments are dropped with their reason.
fn l3_key(h: &Headers) -> Result<FlowKey, DropReason> {
    match h.key {
        None if h.l3 == spillway_wire::L3::Arp => Err(DropReason::ArpNotRouted),
        None => Err(DropReason::UnsupportedEtherType(h.ethertype)),
        // Later fragments are followed before the policy walk; reaching here is a bug's symptom,
        // and dropping is the safe answer.
        Some(_) if h.fragment == Fragment::NonFirst => Err(DropReason::FragmentNoFirst),
        Some(k) => Ok(k),
    }
}

fn frag_drop(d: FragDrop) -> DropReason {
    match d {
        FragDrop::NoFirst => DropReason::FragmentNoFirst,
        FragDrop::Overlap => DropReason::FragmentOverlap,
        FragDrop::TooMany => DropReason::FragmentTooMany,
        FragDrop::TableFull => DropReason::FragmentTableFull,
        FragDrop::Timeout => DropReason::FragmentTimeout,
    }
}

fn ct_create_drop(e: CtError) -> DropReason {
    match e {
        CtError::Full => DropReason::ConntrackFull,
        _ => DropReason::NoConnection,
    }
}
