//! Source-NAT bindings: [`SnatBindings`] owns the per-tenant port pools, keeps them across
//! policy changes while a tenant's range is unchanged, allocates a port for a new internet
//! connection, and takes back a connection's port when it is cut, expires or is reclaimed. The
//! pipeline owns one and lends it the policy, which says which addresses are SNAT addresses.

use std::collections::BTreeMap;

use spillway_wire::icmp::IcmpKind;
use spillway_wire::{FlowKey, IpAddr16};

use super::Shape;
use crate::conntrack::Connection;
use crate::ids::TenantId;
use crate::policy::{Policy, SnatPools, SnatRange};
use crate::verdict::DropReason;

/// Each SNAT tenant's range and its port pools.
#[derive(Default)]
pub(super) struct SnatBindings {
    pools: BTreeMap<TenantId, (SnatRange, SnatPools)>,
}

// Formatted as the bare map, as the pipeline's `Debug` showed it before the map had an owner.
impl core::fmt::Debug for SnatBindings {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.pools.fmt(f)
    }
}

impl SnatBindings {
    /// Pools for the SNAT tenants of `policy`, keeping those whose range is unchanged.
    pub(super) fn rebuild(&mut self, policy: &Policy) {
        let mut pools = BTreeMap::new();
        for t in policy.tenants() {
            if let Some(range) = t.snat.as_ref() {
                // Keep the pools of tenants whose range is unchanged, so live bindings stay valid.
                let pool = match self.pools.remove(&t.id) {
                    Some((old_range, old)) if old_range == *range => old,
                    _ => SnatPools::new(range),
                };
                pools.insert(t.id, (*range, pool));
            }
        }
        self.pools = pools;
    }

    /// The translated address and port for a new connection of `tenant` with `key` to the
    /// internet, or `None` when it is not translated (IPv6).
    pub(super) fn allocate(
        &mut self,
        policy: &Policy,
        tenant: TenantId,
        key: &FlowKey,
    ) -> Result<Option<(IpAddr16, u16)>, DropReason> {
        if !key.src_ip.is_v4() {
            // IPv6 is globally routed: no NAT66.
            return Ok(None);
        }
        let public = policy
            .tenant(tenant)
            .and_then(|t| t.snat.as_ref().map(|s| s.public_ip))
            .ok_or(DropReason::NoRoute)?;
        if key.icmp_kind().is_some_and(|k| k != IcmpKind::Request) {
            // Only ICMP queries carry an identifier that can be translated (and only they open
            // connections; `opens_connection` already refused the rest).
            return Err(DropReason::PolicyDrop);
        }
        let (_, pools) = self.pools.get_mut(&tenant).ok_or(DropReason::NoRoute)?;
        let pool = pools
            .for_protocol(key.proto)
            .ok_or(DropReason::PolicyDrop)?;
        let port = pool.allocate().map_err(|_| DropReason::SnatExhausted)?;
        Ok(Some((public, port)))
    }

    /// Give back the port [`SnatBindings::allocate`] handed a connection that was then not
    /// created.
    pub(super) fn release(&mut self, tenant: TenantId, key: &FlowKey, shape: Shape) {
        if let Shape::Internet {
            nat: Some((_, port)),
            ..
        } = shape
            && let Some(pool) = self
                .pools
                .get_mut(&tenant)
                .and_then(|p| p.1.for_protocol(key.proto))
        {
            let _ = pool.release(port);
        }
    }

    /// Return the SNAT port of a connection that is going away (expired, cut, or reclaimed by
    /// `Conntrack::create` to make room) to its tenant's pool.
    pub(super) fn release_conn(&mut self, policy: &Policy, conn: &Connection) {
        if let Some((tenant, proto, port)) = snat_binding(policy, conn)
            && let Some(pool) = self
                .pools
                .get_mut(&tenant)
                .and_then(|p| p.1.for_protocol(proto))
        {
            let _ = pool.release(port);
        }
    }

    /// Ports (or ICMP identifiers) of `tenant` for `proto` currently bound to connections.
    pub(super) fn in_use(&self, tenant: TenantId, proto: u8) -> u32 {
        self.pools
            .get(&tenant)
            .and_then(|(_, pools)| pools.get(proto))
            .map_or(0, |pool| pool.in_use())
    }
}

/// The SNAT port a connection holds, as `(tenant, protocol, port)`.
fn snat_binding(policy: &Policy, conn: &Connection) -> Option<(TenantId, u8, u16)> {
    let (orig, reply) = (conn.orig(), conn.reply());
    (policy.is_snat_address(reply.dst_ip) == Some(conn.zone()) && reply.dst_ip != orig.src_ip)
        .then(|| (conn.zone(), orig.proto, nat_of_reply(&reply).1))
}

/// The translated address and port a SNATed connection's reply tuple is addressed to. For ICMP
/// the "port" is the query identifier, which the key carries in its source port (the
/// destination port holds the reply's type and code).
pub(super) fn nat_of_reply(reply: &FlowKey) -> (IpAddr16, u16) {
    let port = match reply.icmp_type() {
        Some(_) => reply.src_port,
        None => reply.dst_port,
    };
    (reply.dst_ip, port)
}
