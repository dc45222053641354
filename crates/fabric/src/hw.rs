//! The seam between the DPU node's logic and the DPU's hardware: what a real backend (DOCA
//! Flow, DPDK `rte_flow`, TC flower) would implement. The node keeps everything else (SoC
//! slow path, redirect decisions, connection records, lifecycle, URSched); the hardware only
//! matches and forwards, holds entries, and counts.
//!
//! [`EmulatedHardware`] is the model: the real bounded [`FlowTable`] (refusing inserts when
//! full, as DPU tables do) and a FIFO server at the fast path's packet rate with a bounded
//! input queue.

use core::fmt::Debug;

use spillway_vswitch::Instant;
use spillway_vswitch::flow_table::{
    EvictBy, FlowTable, FlowTableConfig, FullPolicy, Inserted, TableFull,
};

use crate::links::ps;
use crate::params::FabricParams;
use crate::server::{Admitted, Server};
use crate::types::{ConnId, Side};

/// A hardware table key: one direction of a connection.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct HwKey {
    /// The connection.
    pub conn: ConnId,
    /// The direction.
    pub side: Side,
}

/// What a hardware entry remembers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HwRule {
    /// Installed by a recall from the spill plane.
    pub recalled: bool,
}

/// An entry's hardware counters.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EntryStats {
    /// Packets matched since the entry was installed.
    pub packets: u64,
    /// When it was installed.
    pub installed: Instant,
}

/// The DPU hardware fast path. Inserts arrive already rate-limited and delayed by the node's
/// insertion queue; the hardware only has to say whether an entry fits.
pub trait DpuHardware: Debug + Send {
    /// Offers `packets` packets of `key` at `now`. `None`: no live entry (a miss; nothing is
    /// charged). `Some(a)`: matched; `a.count` packets were accepted by the fast path, the rest
    /// overflowed its input queue.
    fn offer(&mut self, now: Instant, key: &HwKey, packets: u32, bytes: u64) -> Option<Admitted>;
    /// Installs an entry; refuses when the table is full.
    fn insert(
        &mut self,
        now: Instant,
        key: HwKey,
        rule: HwRule,
    ) -> Result<Inserted<HwKey>, TableFull>;
    /// Removes an entry; true if there was one.
    fn remove(&mut self, key: &HwKey) -> bool;
    /// The entry's counters.
    fn stats(&self, key: &HwKey) -> Option<EntryStats>;
    /// Entries installed.
    fn len(&self) -> usize;
    /// True when no entry is installed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Entries the table holds at most.
    fn capacity(&self) -> usize;
    /// Fast-path utilisation since the last call (busy time / elapsed).
    fn take_util(&mut self, now: Instant) -> f64;
    /// Checks the hardware model's own invariants.
    fn check_invariants(&self) -> Result<(), String>;
}

/// The emulated hardware. See the module doc.
#[derive(Debug)]
pub struct EmulatedHardware {
    table: FlowTable<HwKey, HwRule>,
    srv: Server,
    per_ps: u64,
}

impl EmulatedHardware {
    /// Hardware with the limits in `f.dpu`, which [`FabricParams::validate`] has checked: the
    /// table is allocated whole, and `dpu.hw_entries_max` is bounded (1..=2^24) so that the
    /// allocation is sane and the flow table accepts the capacity.
    pub fn new(f: &FabricParams) -> EmulatedHardware {
        let d = &f.dpu;
        let table = FlowTable::new(FlowTableConfig {
            capacity: d.hw_entries_max,
            // Hardware entries are removed by their owner, never aged out behind its back.
            idle_timeout: core::time::Duration::from_secs(3600),
            full: FullPolicy::Reject,
            evict: EvictBy::FewestPackets,
            evict_sample: 8,
            hash_seed: 0x5eed_0d9b,
        })
        .expect("FabricParams::validate bounds dpu.hw_entries_max to 1..=2^24");
        EmulatedHardware {
            table,
            srv: Server::new(1, d.hw_queue_packets),
            per_ps: (1e12 / d.hw_pps_limit) as u64,
        }
    }
}

impl DpuHardware for EmulatedHardware {
    fn offer(&mut self, now: Instant, key: &HwKey, packets: u32, bytes: u64) -> Option<Admitted> {
        self.table.lookup_train(now, key, packets, bytes)?;
        Some(self.srv.offer(ps(now), packets, self.per_ps))
    }
    fn insert(
        &mut self,
        now: Instant,
        key: HwKey,
        rule: HwRule,
    ) -> Result<Inserted<HwKey>, TableFull> {
        self.table.insert(now, key, rule, false)
    }
    fn remove(&mut self, key: &HwKey) -> bool {
        self.table.remove(key).is_some()
    }
    fn stats(&self, key: &HwKey) -> Option<EntryStats> {
        self.table.get(key).map(|(_, e)| EntryStats {
            packets: e.packets(),
            installed: e.first_seen(),
        })
    }
    fn len(&self) -> usize {
        self.table.len()
    }
    fn capacity(&self) -> usize {
        self.table.capacity()
    }
    fn take_util(&mut self, now: Instant) -> f64 {
        self.srv.take_util(ps(now))
    }
    fn check_invariants(&self) -> Result<(), String> {
        if self.table.len() > self.table.capacity() {
            return Err(format!(
                "hw: table {} > capacity {}",
                self.table.len(),
                self.table.capacity()
            ));
        }
        self.srv.check_invariants()
    }
}
