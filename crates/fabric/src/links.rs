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

/// One direction of the phy vNIC: a packet server at the vNIC's packet rate (the DPU's
/// host-queue DMA engine for the plane's queue pair). The bytes it moves also cross the PCIe
/// link: the sender charges its [`PcieLink`] after this.
#[derive(Clone, Debug)]
pub(crate) struct PhyVnic {
    server: Server,
    pps_ps: u64,
}

impl PhyVnic {
    pub(crate) fn new(f: &FabricParams) -> PhyVnic {
        PhyVnic {
            server: Server::new(1, f.pcie.phy_vnic_ring),
            pps_ps: (1e12 / f.pcie.phy_vnic_pps_limit) as u64,
        }
    }
    pub(crate) fn offer(&mut self, now_ps: u64, t: &Train) -> Admitted {
        self.server.offer(now_ps, t.packets, self.pps_ps)
    }
    pub(crate) fn take_util(&mut self, now_ps: u64) -> f64 {
        self.server.take_util(now_ps)
    }
    pub(crate) fn busy_until_ps(&self) -> u64 {
        self.server.busy_until_ps()
    }
}

/// One direction of the PCIe link: a FIFO server at `pcie.bandwidth_bytes`, each packet
/// occupying it for its bytes plus `pcie.overhead_bytes` (descriptor and TLP overhead). One
/// instance per direction carries every packet crossing that the model charges in it, whoever
/// sends it, so the crossings of the DPU's own VM traffic, of steered packets and of the
/// plane's return path compete for the same bandwidth. The crossing's latency
/// (`pcie.latency`) is added by whoever carries the packet on (the driver for messages between
/// the nodes, the DPU for a write into a VM).
#[derive(Clone, Debug)]
pub(crate) struct PcieLink {
    server: Server,
    ps_per_byte: f64,
    overhead: u32,
    queue_half: u32,
}

impl PcieLink {
    pub(crate) fn new(f: &FabricParams) -> PcieLink {
        PcieLink {
            server: Server::new(1, f.pcie.link_queue_packets),
            ps_per_byte: 1e12 / f.pcie.bandwidth_bytes,
            overhead: f.pcie.overhead_bytes,
            queue_half: f.pcie.link_queue_packets / 2,
        }
    }

    /// `n` packets of `bytes` each start crossing at `now_ps`; the rest of the batch is refused
    /// (the caller drops it as `pcie.link_full`).
    pub(crate) fn cross(&mut self, now_ps: u64, n: u32, bytes: u32) -> Admitted {
        let per = (f64::from(bytes.saturating_add(self.overhead)) * self.ps_per_byte) as u64;
        self.server.offer(now_ps, n, per.max(1))
    }

    pub(crate) fn busy_until_ps(&self) -> u64 {
        self.server.busy_until_ps()
    }

    /// Packets a sender that backs off may still queue at `now_ps`: half the link's queue
    /// minus what is queued. PCIe is lossless (credit-based flow control): a busy link backs up
    /// into the rings feeding it rather than dropping; the DPU stops steering into a link that
    /// is half full, which keeps the other half for the writes into VMs that follow.
    pub(crate) fn room(&mut self, now_ps: u64) -> u32 {
        (self.queue_half).saturating_sub(self.server.queued(now_ps))
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
