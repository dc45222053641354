//! Answering a drop the way a router does: deciding whether a dropped frame gets an ICMP error,
//! from which address and MACs, and handing it to the rate-limited builder in [`crate::router`].
//! This runs as the last step of a batch, for fast-path and slow-path drops alike.

use spillway_wire::ParsedFrame;

use super::Pipeline;
use crate::ids::PortId;
use crate::packet::PacketBuf;
use crate::router::{ErrorOrigin, IcmpError};
use crate::time::Instant;

impl Pipeline {
    /// Turn the frame into the ICMP error `err` back to its sender, if a router would send one
    /// (see [`crate::router`]). From a VM port every routed drop is answered, from the tenant's
    /// router; from the uplink only internet traffic to a SNAT address that the router refused
    /// (TTL, MTU), from the address it was sent to. Frames that came over VXLAN were routed by
    /// their sender's host and are never answered here.
    pub(super) fn answer(
        &mut self,
        now: Instant,
        ingress: PortId,
        pkt: &mut PacketBuf,
        parsed: &ParsedFrame,
        err: IcmpError,
    ) -> bool {
        let h = &parsed.outer;
        let Some(key) = h.key else { return false };
        let host = *self.policy.host();
        let origin = if ingress == host.uplink_port {
            let refused = matches!(err, IcmpError::TimeExceeded | IcmpError::TooBig { .. });
            if parsed.vxlan.is_some() || !refused {
                return false;
            }
            self.policy
                .is_snat_address(key.dst_ip)
                .map(|_| ErrorOrigin {
                    src_mac: host.uplink_mac,
                    dst_mac: host.gateway_mac,
                    src_ip: key.dst_ip,
                })
        } else {
            let Some(port) = self.policy.port(ingress) else {
                return false;
            };
            self.policy.tenant(port.tenant).and_then(|t| {
                Some(ErrorOrigin {
                    src_mac: t.router_mac,
                    dst_mac: port.mac,
                    src_ip: crate::router::router_source(t, key.src_ip)?,
                })
            })
        };
        self.router.answer(now, ingress, pkt, h, err, origin)
    }
}
