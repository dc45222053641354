//! Unified flow entries: what the slow path produces and the fast path (the DPU hardware table
//! or a software cache) executes.

use crate::action::ActionList;
use crate::conntrack::{CtDir, CtHandle};
use crate::flow_table::EntryIdx;
use crate::ids::{Epoch, PortId, TenantId};
use crate::time::Instant;
use spillway_wire::{FlowKey, MacAddr, Vni};

/// The exact match of a flow entry: where the packet entered, the VNI when it arrived VXLAN
/// encapsulated on the uplink, and the (inner) 5-tuple.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub struct FlowMatch {
    /// Ingress port.
    pub port: PortId,
    /// VNI of a VXLAN packet on the uplink, `None` for VM ports and non-overlay uplink traffic.
    pub vni: Option<Vni>,
    /// The 5-tuple (of the inner packet for VXLAN).
    pub key: FlowKey,
}

/// A unified flow entry's value: the header transformation plus what the fast path needs to keep
/// conntrack and anti-spoofing exact without walking the policy.
///
/// `repr(C)` with the fields every hit reads first (epoch, connection, MAC check) and the action
/// list after them: in the flow table the entry follows the key and counters, so a
/// decap-and-deliver hit reads three cache lines of its slot and an encap hit four.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FlowEntry {
    /// Policy epoch the entry was computed under; an older epoch makes it stale.
    pub epoch: Epoch,
    /// When this entry last refreshed the connection's idle timer.
    pub ct_refreshed_at: Instant,
    /// The connection and which of its directions this entry carries.
    pub ct: Option<(CtHandle, CtDir)>,
    /// The tenant (conntrack zone) the entry belongs to.
    pub tenant: TenantId,
    /// For entries matching on a VM port: the port's MAC, so anti-spoofing holds on the fast path
    /// too (the 5-tuple in the match does not cover the source MAC).
    pub expect_src_mac: Option<MacAddr>,
    /// The connection had reached its steady state (TCP established, UDP/ICMP replied) the last
    /// time this entry stepped it; then only SYN/FIN/RST packets step it again. An entry that
    /// steps the connection out of its steady state clears its peer's flag too (see `peer`).
    pub ct_steady: bool,
    /// Slot of the entry for the other direction of the connection, set when both were
    /// installed. It may outlive that entry (eviction, expiry); it is only ever used to clear a
    /// `ct_steady` flag, which is safe on any entry: it costs that entry one extra conntrack step.
    pub peer: Option<EntryIdx>,
    /// The header transformation.
    pub actions: ActionList,
}

/// Hashes the match as six `u64` words instead of the derived field-by-field walk (a dozen
/// `write` calls of 1-16 bytes each, measured at 28% of a flow-table lookup). Equal matches
/// write equal words, so the `Hash`/`Eq` contract holds; `None` and `Some(vni)` differ in bit 40
/// of the ports word, so they never collide structurally.
impl core::hash::Hash for FlowMatch {
    #[inline]
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        let k = &self.key;
        let word = |b: &[u8; 16], i: usize| {
            u64::from_le_bytes([
                b[i],
                b[i + 1],
                b[i + 2],
                b[i + 3],
                b[i + 4],
                b[i + 5],
                b[i + 6],
                b[i + 7],
            ])
        };
        let (has_vni, vni) = self.vni.map_or((0, 0), |v| (1u64, u64::from(v.get())));
        state.write_u64(word(&k.src_ip.0, 0));
        state.write_u64(word(&k.src_ip.0, 8));
        state.write_u64(word(&k.dst_ip.0, 0));
        state.write_u64(word(&k.dst_ip.0, 8));
        state.write_u64(
            u64::from(k.src_port)
                | u64::from(k.dst_port) << 16
                | u64::from(k.proto) << 32
                | has_vni << 40,
        );
        state.write_u64(u64::from(self.port.0) | vni << 32);
    }
}
