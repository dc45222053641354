//! What a policy change does to established connections of a tenant that asked for it
//! (`on_policy_change = "recheck"`; with `"keep"`, the default, nothing here runs).
//!
//! # The rule
//!
//! A connection is admitted under a policy when that policy's security groups would admit its
//! first packet: the original tuple (before SNAT, as the groups saw it), through the source
//! VM's egress rules when the source is a local VM and the destination VM's ingress rules when
//! the destination is one (both for a VM-to-VM connection on this host). Its reply direction is
//! never judged on its own: replies ride the state, so the connection lives or dies as a whole.
//! A connection that is no longer admitted is *cut*: removed from conntrack, its SNAT binding
//! returned to the pool, its two flow entries removed, and the packet that found it dropped as
//! [`DropReason::PolicyRevoked`], counted in `vswitch.policy.conn_cut`. A later packet with
//! either tuple is then a packet of no connection, judged as such (a new connection if it
//! may open one, under the new groups).
//!
//! # When: lazily, on the connection's next packet
//!
//! A policy change bumps the epoch, so every flow entry is stale and the next packet of every
//! connection takes the slow path, where [`Pipeline::recheck`] runs before conntrack is
//! stepped (for ICMP errors related to the connection too). A flow entry of the current epoch
//! is only ever built for a connection admitted under the current policy, so the fast path
//! needs no check. Nothing is swept at `set_policy`: the verdict stays a function of the packet,
//! the connection table and the current policy alone, not of how far a sweep had got, which is
//! what lets two planes on the same policy agree (path equivalence), and a reload costs no
//! stall proportional to the connection count. The price: an idle revoked connection keeps its
//! conntrack slot and SNAT port until its next packet or its idle timeout.
//!
//! # Across planes
//!
//! Both planes apply the same rule to the same policy, so a connection one plane cut is revoked
//! on the other as well: a copy held there is cut by its own next packet, and
//! [`Pipeline::adopt_conn`] refuses a snapshot the adopting pipeline's policy revokes, so state
//! sync from a plane that has not reloaded yet cannot resurrect a cut connection. A copy the
//! adopting pipeline already holds stays until its next packet cuts it, as on the other plane.

use spillway_wire::{FlowKey, IpAddr16};

use super::{AdoptError, Pipeline, Shape};
use crate::conntrack::{CtDir, CtHandle, CtSnapshot};
use crate::ids::{Direction, TenantId};
use crate::policy::OnPolicyChange;
use crate::verdict::DropReason;

impl Pipeline {
    /// For a tenant that rechecks connections: cut connection `handle` (matched in direction
    /// `dir`, over the overlay from `learned_vtep`) if the current policy no longer admits it,
    /// and return [`DropReason::PolicyRevoked`]. A connection whose shape the current policy
    /// cannot give (no route, no such VM) is left to the caller, which drops the packet with
    /// that reason as it does for every tenant.
    pub(super) fn recheck(
        &mut self,
        tenant: TenantId,
        handle: CtHandle,
        learned_vtep: Option<IpAddr16>,
        dir: CtDir,
    ) -> Result<(), DropReason> {
        if self.policy.on_policy_change(tenant) == OnPolicyChange::Keep {
            return Ok(());
        }
        let Some(conn) = self.ct.get(handle) else {
            return Ok(());
        };
        let (orig, reply, tag) = (conn.orig(), conn.reply(), conn.tag());
        let Ok(shape) = self.shape_of(tenant, &orig, &reply, tag, learned_vtep, dir) else {
            return Ok(());
        };
        if self.admits(&orig, shape) {
            return Ok(());
        }
        self.cut(tenant, handle, &orig, shape);
        Err(DropReason::PolicyRevoked)
    }

    /// Whether the current security groups admit a connection with original tuple `orig`
    /// crossing the switch as `shape`, as they would judge its first packet.
    fn admits(&self, orig: &FlowKey, shape: Shape) -> bool {
        let ok = |port, dir| {
            self.policy
                .sg_evaluate(port, dir, orig)
                .drop_reason()
                .is_none()
        };
        match shape {
            Shape::Local { a, b } => ok(a, Direction::Egress) && ok(b, Direction::Ingress),
            Shape::TunnelOut { a, .. } | Shape::Internet { a, .. } => ok(a, Direction::Egress),
            Shape::TunnelIn { b, .. } => ok(b, Direction::Ingress),
        }
    }

    /// Remove a revoked connection: its flow entries (those still naming it), its conntrack
    /// entry and its SNAT binding.
    fn cut(&mut self, tenant: TenantId, handle: CtHandle, orig: &FlowKey, shape: Shape) {
        // The entries are stale already (older epoch, and the handle dies below); removing them
        // gives their table slots back now rather than at their idle timeout.
        if let Ok((fwd, rev)) = self.build_entries(tenant, handle, orig, shape) {
            for (fm, _) in [fwd, rev] {
                let ours = self
                    .flows
                    .get(&fm)
                    .is_some_and(|(_, e)| e.value().ct.is_some_and(|(h, _)| h == handle));
                if ours {
                    self.flows.remove(&fm);
                }
            }
        }
        if let Some(c) = self.ct.remove(handle) {
            self.snat.release_conn(&self.policy, &c);
            self.counters.conn_cut += 1;
        }
    }

    /// For [`Pipeline::adopt_conn`]: refuse a snapshot of a connection the current policy
    /// revokes (its tenant rechecks connections).
    pub(super) fn recheck_adopted(&self, s: &CtSnapshot) -> Result<(), AdoptError> {
        if self.policy.on_policy_change(s.zone) == OnPolicyChange::Keep {
            return Ok(());
        }
        let Ok(shape) = self.shape_of(s.zone, &s.orig, &s.reply, s.tag, None, CtDir::Original)
        else {
            return Ok(());
        };
        if self.admits(&s.orig, shape) {
            return Ok(());
        }
        // A copy this pipeline holds is left for its next packet to cut: cutting it here would
        // make that packet a packet of no connection on this plane while the other plane, with
        // its copy, drops it as revoked; lazily, both give `PolicyRevoked`.
        Err(AdoptError::Revoked)
    }
}
