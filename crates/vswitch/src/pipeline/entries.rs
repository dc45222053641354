//! The flow entries of a connection: its [`Shape`] (how it crosses the vSwitch), the forward
//! and reverse entries built from the shape under the current policy, and their installation.
//! The slow path builds them for new and rebuilt connections; a recheck rebuilds them to find
//! and remove the entries of a connection it cuts.

use spillway_wire::build::VxlanOuter;
use spillway_wire::{FlowKey, IpAddr16, Vni};

use super::Pipeline;
use crate::action::{Action, ActionList, NatSide};
use crate::conntrack::{CtDir, CtHandle};
use crate::flow::{FlowEntry, FlowMatch};
use crate::flow_table::Inserted;
use crate::ids::{PortId, TenantId};
use crate::time::Instant;
use crate::verdict::DropReason;

/// A flow entry with its match, ready to install.
pub(super) type Installable = (FlowMatch, FlowEntry);

/// How a connection crosses the vSwitch; enough to rebuild both flow entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// VM `a` to VM `b`, both on this host.
    Local { a: PortId, b: PortId },
    /// VM `a` to a remote subnet behind `vtep`.
    TunnelOut { a: PortId, vtep: IpAddr16 },
    /// A remote sender behind `vtep` to VM `b`.
    TunnelIn { b: PortId, vtep: IpAddr16 },
    /// VM `a` to the internet through the underlay, SNATed to `nat` (IPv4) or not (IPv6).
    Internet {
        a: PortId,
        nat: Option<(IpAddr16, u16)>,
    },
}

impl Pipeline {
    /// Build and install both entries of a connection; return the one for direction `dir`.
    pub(super) fn install(
        &mut self,
        now: Instant,
        tenant: TenantId,
        handle: CtHandle,
        dir: CtDir,
        orig: &FlowKey,
        shape: Shape,
    ) -> Result<FlowEntry, DropReason> {
        let (fwd, rev) = self.build_entries(tenant, handle, orig, shape)?;
        if self.fast_path_enabled {
            let mut slots = [None; 2];
            for (i, &(fm, e)) in [fwd, rev].iter().enumerate() {
                match self.flows.insert_indexed(now, fm, e, true) {
                    Ok((idx, outcome)) => {
                        self.counters.flows_installed += 1;
                        if let Inserted::Evicted { victim } = outcome {
                            self.counters.flows_evicted += 1;
                            // The reverse entry may have evicted the forward one just installed.
                            if victim == fwd.0 {
                                slots[0] = None;
                            }
                        }
                        slots[i] = Some(idx);
                    }
                    Err(_) => self.counters.flows_rejected += 1,
                }
            }
            if let [Some(f), Some(r)] = slots {
                self.flows.value_mut(f).peer = Some(r);
                self.flows.value_mut(r).peer = Some(f);
            }
        }
        Ok(match dir {
            CtDir::Original => fwd.1,
            CtDir::Reply => rev.1,
        })
    }

    /// The forward (original direction) and reverse (reply direction) entries of a connection.
    pub(super) fn build_entries(
        &self,
        tenant: TenantId,
        handle: CtHandle,
        orig: &FlowKey,
        shape: Shape,
    ) -> Result<(Installable, Installable), DropReason> {
        let host = *self.policy.host();
        let t = self.policy.tenant(tenant).ok_or(DropReason::PolicyDrop)?;
        let router = t.router_mac;
        let vni = t.vni;
        let port_of = |p: PortId| {
            self.policy
                .port(p)
                .map(|vp| (vp.mac, vp.mtu))
                .ok_or(DropReason::NoSuchVm)
        };
        // What the tenant router does to every packet it forwards: TTL and the next link's MTU.
        let route = |mtu: u16| Action::Route { mtu };
        let entry = |actions: ActionList, dir: CtDir, mac| FlowEntry {
            epoch: self.epoch,
            tenant,
            actions,
            expect_src_mac: mac,
            ct: Some((handle, dir)),
            ct_steady: false,
            ct_refreshed_at: Instant::ZERO,
            peer: None,
        };
        // The builder's lists always fit and policy validation keeps both VTEPs in one family, so
        // encoding cannot fail; if it ever did, the flow gets a counted drop, never a panic.
        let list = |acts: &[Action]| {
            ActionList::from_actions(acts).unwrap_or_else(|_| {
                ActionList::from_actions(&[Action::Drop(DropReason::PolicyDrop)])
                    .expect("a single drop always fits")
            })
        };
        let reply = reply_key(orig, shape);
        let encap = |to: IpAddr16, inner: &FlowKey| VxlanOuter {
            src_mac: host.uplink_mac,
            dst_mac: host.gateway_mac,
            src_ip: host.vtep_ip.to_std(),
            dst_ip: to.to_std(),
            src_port: self.entropy_port(inner),
            dst_port: host.vxlan_port,
            vni,
            ttl: 64,
        };
        // Where an entry matches, and what it does, in the few forms connections take.
        let at_vm = |port: PortId, key: FlowKey| FlowMatch {
            port,
            vni: None,
            key,
        };
        let at_uplink = |vni: Option<Vni>, key: FlowKey| FlowMatch {
            port: host.uplink_port,
            vni,
            key,
        };
        let set_macs = |mac| Action::SetMacs {
            src: router,
            dst: mac,
        };
        let to_vm = |port: PortId, (mac, mtu)| [route(mtu), set_macs(mac), Action::Output(port)];
        // Delivered as it came: the sending host's router already routed it.
        let decap_to_vm =
            |port: PortId, (mac, _)| [Action::Decap, set_macs(mac), Action::Output(port)];
        let overlay_mtu = host.overlay_mtu();
        let to_remote = |vtep: IpAddr16, inner: &FlowKey| {
            [
                route(overlay_mtu),
                // The remote vSwitch rewrites the inner MACs on delivery.
                Action::SetMacs {
                    src: router,
                    dst: router,
                },
                Action::Encap(encap(vtep, inner)),
                Action::Output(host.uplink_port),
            ]
        };
        let (fwd, rev) = match shape {
            Shape::Local { a, b } => {
                let (pa, pb) = (port_of(a)?, port_of(b)?);
                (
                    (
                        at_vm(a, *orig),
                        entry(list(&to_vm(b, pb)), CtDir::Original, Some(pa.0)),
                    ),
                    (
                        at_vm(b, reply),
                        entry(list(&to_vm(a, pa)), CtDir::Reply, Some(pb.0)),
                    ),
                )
            }
            Shape::TunnelOut { a, vtep } => {
                let pa = port_of(a)?;
                let out = list(&to_remote(vtep, orig));
                (
                    (at_vm(a, *orig), entry(out, CtDir::Original, Some(pa.0))),
                    (
                        at_uplink(Some(vni), reply),
                        entry(list(&decap_to_vm(a, pa)), CtDir::Reply, None),
                    ),
                )
            }
            Shape::TunnelIn { b, vtep } => {
                let pb = port_of(b)?;
                let back = list(&to_remote(vtep, &reply));
                (
                    (
                        at_uplink(Some(vni), *orig),
                        entry(list(&decap_to_vm(b, pb)), CtDir::Original, None),
                    ),
                    (at_vm(b, reply), entry(back, CtDir::Reply, Some(pb.0))),
                )
            }
            Shape::Internet { a, nat } => {
                let pa = port_of(a)?;
                let ma = pa.0;
                let out_macs = Action::SetMacs {
                    src: host.uplink_mac,
                    dst: host.gateway_mac,
                };
                let [in_route, in_macs, to_a] = to_vm(a, pa);
                let out_route = route(host.underlay_mtu);
                let uplink_out = Action::Output(host.uplink_port);
                let (fwd_acts, rev_acts) = match nat {
                    Some((ip, port)) => {
                        let snat = Action::Nat {
                            side: NatSide::Source,
                            ip,
                            port,
                        };
                        let unsnat = Action::Nat {
                            side: NatSide::Destination,
                            ip: orig.src_ip,
                            port: orig.src_port,
                        };
                        (
                            list(&[out_route, snat, out_macs, uplink_out]),
                            list(&[in_route, unsnat, in_macs, to_a]),
                        )
                    }
                    None => (
                        list(&[out_route, out_macs, uplink_out]),
                        list(&[in_route, in_macs, to_a]),
                    ),
                };
                (
                    (at_vm(a, *orig), entry(fwd_acts, CtDir::Original, Some(ma))),
                    (at_uplink(None, reply), entry(rev_acts, CtDir::Reply, None)),
                )
            }
        };
        Ok((fwd, rev))
    }

    /// VXLAN UDP source port for a flow: from the flow hash, in the dynamic range 49152-65535
    /// (RFC 7348 section 5 recommends that range).
    fn entropy_port(&self, key: &FlowKey) -> u16 {
        use core::hash::BuildHasher;
        let h = self.hasher.hash_one(key);
        49152 | (h as u16 & 0x3fff)
    }
}

/// The tuple the reply of `orig` carries, given the connection's shape.
pub(super) fn reply_key(orig: &FlowKey, shape: Shape) -> FlowKey {
    match shape {
        Shape::Internet {
            nat: Some((ip, port)),
            ..
        } => {
            let mut r = orig.reversed();
            r.dst_ip = ip;
            if r.icmp_type().is_some() {
                // The reply carries the translated identifier; its type stays in `dst_port`.
                r.src_port = port;
            } else {
                r.dst_port = port;
            }
            r
        }
        _ => orig.reversed(),
    }
}

/// The conntrack tag of a connection that arrived over the overlay remembers the sender's IPv4
/// VTEP, so its reverse entry can be rebuilt after eviction without a route. Bit 32 marks it.
pub(super) fn vtep_tag(vtep: IpAddr16) -> u64 {
    match vtep.v4_octets() {
        Some(o) => (1 << 32) | u64::from(u32::from_be_bytes(o)),
        None => 0,
    }
}

pub(super) fn tag_vtep(tag: u64) -> Option<IpAddr16> {
    (tag >> 32 == 1).then(|| IpAddr16::from_v4((tag as u32).to_be_bytes()))
}
