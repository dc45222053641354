//! The vNIC set's two data-path channels as the nodes see them: the phy vNIC (packets, one
//! direction per instance) and the flow vNIC (state sync and recalls, rate-limited messages),
//! plus the nanosecond <-> picosecond conversions the servers use.

use spillway_vswitch::Instant;

use crate::params::FabricParams;
use crate::server::{Admitted, PS_PER_NS, Server};
use crate::types::Train;

/// `now` in picoseconds.
pub(crate) fn ps(i: Instant) -> u64 {
    i.0 * PS_PER_NS
}

/// A picosecond time as an `Instant`, rounded up (never earlier than the event).
pub(crate) fn at_ps(p: u64) -> Instant {
    Instant(p.div_ceil(PS_PER_NS))
}

/// One direction of the phy vNIC: a packet server at the vNIC's packet rate or the PCIe
/// bandwidth, whichever binds for the packet size.
#[derive(Clone, Debug)]
pub(crate) struct PhyVnic {
    server: Server,
    pps_ps: u64,
    bw_ps_per_byte: f64,
    overhead: u32,
}

impl PhyVnic {
    pub(crate) fn new(f: &FabricParams) -> PhyVnic {
        PhyVnic {
            server: Server::new(1, f.pcie.phy_vnic_ring),
            pps_ps: (1e12 / f.pcie.phy_vnic_pps_limit) as u64,
            bw_ps_per_byte: 1e12 / f.pcie.bandwidth_bytes,
            overhead: f.pcie.overhead_bytes,
        }
    }
    pub(crate) fn offer(&mut self, now_ps: u64, t: &Train) -> Admitted {
        let bw = (f64::from(t.packet_bytes + self.overhead) * self.bw_ps_per_byte) as u64;
        self.server.offer(now_ps, t.packets, self.pps_ps.max(bw))
    }
    pub(crate) fn take_util(&mut self, now_ps: u64) -> f64 {
        self.server.take_util(now_ps)
    }
    pub(crate) fn busy_until_ps(&self) -> u64 {
        self.server.busy_until_ps()
    }
}

/// The sending side of the flow vNIC: messages leave at its message rate, in order. Never
/// refuses: its queue is sized for a bulk sync, and a full one only delays.
#[derive(Clone, Debug)]
pub(crate) struct FlowVnic {
    server: Server,
    per_ps: u64,
}

impl FlowVnic {
    pub(crate) fn new(f: &FabricParams) -> FlowVnic {
        FlowVnic {
            server: Server::new(1, 1 << 20),
            per_ps: (1e12 / f.pcie.flow_vnic_msgs_limit) as u64,
        }
    }

    /// Queues one message at `now`; returns when it leaves.
    pub(crate) fn depart(&mut self, now: Instant) -> Instant {
        let a = self.server.offer(ps(now), 1, self.per_ps);
        if a.count == 1 {
            at_ps(a.finish_ps)
        } else {
            at_ps(self.server.busy_until_ps())
        }
    }

    /// When everything queued so far has left (`now` if nothing is queued).
    pub(crate) fn idle_at(&self, now: Instant) -> Instant {
        at_ps(self.server.busy_until_ps().max(ps(now)))
    }
}
