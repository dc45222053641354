//! The DPU's finite resources, in one object: the hardware fast path and its table (behind
//! [`DpuHardware`]), the SoC cores that run the slow path, the steering engine that sends
//! redirected packets to the host, the phy vNIC and PCIe link toward the host, memory, and the
//! insertion engine.
//!
//! Everything the emulated DPU can run out of lives here and nowhere else in the node, so the
//! limits are charged in one place: the node's logic asks ("may this connection get a record?",
//! "what did the SoC admit?") and the answer carries the cost.
//!
//! These are the DPU's limits, not a forwarding thread's: a 30 kpps fast path admits 30 kpps in
//! total whatever number of shards forward through it (ADR 0011). So a node does not own its
//! `Resources`; it reaches them through a [`ResourcesHandle`]. The simulator's handle is the
//! object itself (no lock, no cost); a driver that forwards on several threads gives each
//! shard a handle to one shared object, and decides how it is shared (the core takes no lock).

use core::cell::{Ref, RefCell, RefMut};
use core::ops::{Deref, DerefMut};
use std::rc::Rc;

use spillway_vswitch::Instant;
use spillway_vswitch::flow_table::Inserted;

use super::window::Utils;
use crate::hw::{DpuHardware, EntryStats, HwKey, HwRule};
use crate::links::{PcieLink, PhyVnic, ps};
use crate::params::{FabricParams, ns};
use crate::server::{Admitted, PS_PER_NS, Server};
use crate::types::{ConnId, Side, Train};

/// How a DPU node reaches the DPU's [`Resources`]: the seam between one DPU's limits and the
/// shards that forward through it.
///
/// A node takes a guard for each charge and drops it before the next; it never holds one
/// across a call into anything else, so a handle behind a lock cannot deadlock on it.
pub trait ResourcesHandle: core::fmt::Debug {
    /// Read access.
    type Read<'a>: Deref<Target = Resources>
    where
        Self: 'a;
    /// Write access.
    type Write<'a>: DerefMut<Target = Resources>
    where
        Self: 'a;
    /// True when the node holding this handle (with all its shards) is the only one charging
    /// the resources: its records are then all the records, and the node checks the
    /// resources' count of them against its own.
    const EXCLUSIVE: bool;
    /// The resources, to read.
    fn read(&self) -> Self::Read<'_>;
    /// The resources, to charge.
    fn write(&mut self) -> Self::Write<'_>;
}

/// One node's own resources, for a node of one shard: the real-time driver's handle.
impl ResourcesHandle for Resources {
    type Read<'a> = &'a Resources;
    type Write<'a> = &'a mut Resources;
    const EXCLUSIVE: bool = true;
    fn read(&self) -> &Resources {
        self
    }
    fn write(&mut self) -> &mut Resources {
        self
    }
}

/// A handle for the shards of one node in one thread (the simulator's): the resources in a
/// `RefCell` the shards share. A shard takes a guard for one charge and drops it before
/// anything else runs (see [`ResourcesHandle`]), so no borrow ever overlaps another. Every
/// handle to one `Resources` must belong to the same node.
#[derive(Clone, Debug)]
pub struct ShardCell(Rc<RefCell<Resources>>);

impl ShardCell {
    /// The first handle to `res`; clone it for the other shards.
    pub fn new(res: Resources) -> ShardCell {
        ShardCell(Rc::new(RefCell::new(res)))
    }
}

impl ResourcesHandle for ShardCell {
    type Read<'a> = Ref<'a, Resources>;
    type Write<'a> = RefMut<'a, Resources>;
    const EXCLUSIVE: bool = true;
    fn read(&self) -> Ref<'_, Resources> {
        self.0.borrow()
    }
    fn write(&mut self) -> RefMut<'_, Resources> {
        self.0.borrow_mut()
    }
}

/// What a packet asks of the SoC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SocWork {
    /// A policy walk for a new connection (`soc_new_conn_cost`), also paid by a denied one.
    NewConn,
    /// A packet of a known connection that missed the fast path (`soc_miss_cost`).
    Miss,
    /// A state message ingested from the plane (`soc_sync_cost`).
    Sync,
    /// A rule command a new connection's cost does not cover: a recall's insert, a delete
    /// (`soc_rule_cost`).
    Rule,
}

/// The DPU's resources. See the module doc.
#[derive(Debug)]
pub struct Resources {
    hw: Box<dyn DpuHardware>,
    soc: Server,
    soc_new_ps: u64,
    soc_miss_ps: u64,
    soc_sync_ps: u64,
    soc_rule_ps: u64,
    /// SoC time spent on rule commands so far, ps (charged or not: a delete happens even when
    /// the SoC's queue is full, and is counted here anyway).
    pub(crate) rule_soc_ps: u64,
    steer: Server,
    steer_ps: u64,
    /// The phy vNIC toward the host (steered packets).
    pub(crate) to_host: PhyVnic,
    /// The PCIe link toward the host: steered packets and every write into a VM.
    pub(crate) link_down: PcieLink,
    mem_used: u64,
    mem_bytes: u64,
    mem_per_conn: u64,
    mem_per_entry: u64,
    /// Connection records held, by every node charging these resources.
    conns: u64,
    /// The insertion engine: one server at `insert_rate_limit` behind `insert_queue_max`.
    insert_engine: Server,
    insert_ps: u64,
    /// Inserts the engine has taken that have not reached the hardware yet: each will take an
    /// entry if it succeeds.
    promised: usize,
    /// Fast-path headroom for recalls in this measurement window, packets/s.
    headroom_pps: f64,
    /// Headroom already granted to recalls in this window, packets/s.
    recalled_pps: f64,
}

impl Resources {
    /// The resources of a DPU with the limits in `f`, over `hw`.
    pub fn new(f: &FabricParams, hw: Box<dyn DpuHardware>) -> Resources {
        let d = &f.dpu;
        let per_ps = |d: core::time::Duration| ns(d) * PS_PER_NS;
        Resources {
            hw,
            soc: Server::new(d.soc_cores, d.soc_queue_packets),
            soc_new_ps: per_ps(d.soc_new_conn_cost),
            soc_miss_ps: per_ps(d.soc_miss_cost),
            soc_sync_ps: per_ps(d.soc_sync_cost),
            soc_rule_ps: per_ps(d.soc_rule_cost),
            rule_soc_ps: 0,
            steer: Server::new(1, 1 << 16),
            steer_ps: (1e12 / d.steer_pps_limit).max(1.0) as u64,
            to_host: PhyVnic::new(f),
            link_down: PcieLink::new(f),
            mem_used: 0,
            mem_bytes: d.mem_bytes,
            mem_per_conn: d.mem_per_conn,
            mem_per_entry: d.mem_per_entry,
            conns: 0,
            insert_engine: Server::new(1, d.insert_queue_max),
            insert_ps: (1e12 / d.insert_rate_limit) as u64,
            promised: 0,
            headroom_pps: 0.0,
            recalled_pps: 0.0,
        }
    }

    /// Offers a train to the fast path: `None` on a miss (nothing charged).
    pub(crate) fn offer_fast_path(&mut self, now: Instant, t: &Train) -> Option<Admitted> {
        let key = HwKey {
            conn: t.conn,
            side: t.side,
        };
        let bytes = u64::from(t.packets) * u64::from(t.packet_bytes);
        self.hw.offer(now, &key, t.packets, bytes)
    }

    /// Offers `packets` packets of `work` to the SoC's cores.
    pub(crate) fn soc(&mut self, now: Instant, work: SocWork, packets: u32) -> Admitted {
        let cost = match work {
            SocWork::NewConn => self.soc_new_ps,
            SocWork::Miss => self.soc_miss_ps,
            SocWork::Sync => self.soc_sync_ps,
            SocWork::Rule if self.soc_rule_ps == 0 => {
                // Not modelled (the default): no time, and no room taken in the queue.
                return Admitted {
                    count: packets,
                    finish_ps: ps(now),
                    wait_sum_ps: 0,
                    per_ps: 0,
                };
            }
            SocWork::Rule => {
                self.rule_soc_ps += self.soc_rule_ps * u64::from(packets);
                self.soc_rule_ps
            }
        };
        self.soc.offer(ps(now), packets, cost)
    }

    /// Offers `packets` packets to the steering engine (redirected, or returned by the plane).
    pub(crate) fn steer(&mut self, now: Instant, packets: u32) -> Admitted {
        self.steer.offer(ps(now), packets, self.steer_ps)
    }

    /// One insert command offered to the insertion engine at `now`: `count` is 0 when its
    /// queue is full, and `finish_ps` is when the engine has executed it.
    pub(crate) fn insert_slot(&mut self, now: Instant) -> Admitted {
        let a = self.insert_engine.offer(ps(now), 1, self.insert_ps);
        self.promised += a.count as usize;
        a
    }

    /// An insert the engine took has reached the hardware (taken or refused there).
    pub(crate) fn insert_due(&mut self) {
        self.promised -= 1;
    }

    /// A new window's recall headroom: what the fast path can still take, packets/s. Recalls
    /// granted in the last window are in the measurement that gave it.
    pub(crate) fn set_headroom(&mut self, pps: f64) {
        self.headroom_pps = pps;
        self.recalled_pps = 0.0;
    }

    /// True when a recall adding `charge` packets/s fits the headroom left in this window.
    pub(crate) fn recall_fits(&self, charge: f64) -> bool {
        charge <= self.headroom_pps - self.recalled_pps
    }

    /// A recall was granted `charge` packets/s of headroom.
    pub(crate) fn grant(&mut self, charge: f64) {
        self.recalled_pps += charge;
    }

    /// Headroom left in this window, packets/s.
    pub(crate) fn headroom_left(&self) -> f64 {
        (self.headroom_pps - self.recalled_pps).max(0.0)
    }

    /// The recall budget the DPU sends the plane every window (`Msg::Budget`): free hardware
    /// entries and the fast-path headroom left, packets/s.
    pub(crate) fn recall_budget(&self) -> (usize, f64) {
        (self.free_entries(), self.headroom_left())
    }

    /// When everything queued toward the host has left (the phy vNIC and the PCIe link), not
    /// before `now`, in picoseconds.
    pub(crate) fn host_idle_ps(&self, now: Instant) -> u64 {
        self.to_host
            .busy_until_ps()
            .max(self.link_down.busy_until_ps())
            .max(ps(now))
    }

    /// Takes the memory of one more connection record if it fits: the check and the charge
    /// in one call, so that two shards on two threads can never both take the last room.
    /// [`Resources::conn_removed`] gives it back.
    pub(crate) fn reserve_conn(&mut self) -> bool {
        if self.mem_used + self.mem_per_conn > self.mem_bytes {
            return false;
        }
        self.conn_added();
        true
    }

    /// A connection record was created whatever the memory (a handover the DPU must take).
    pub(crate) fn conn_added(&mut self) {
        self.conns += 1;
        self.mem_used += self.mem_per_conn;
    }

    /// A connection record was removed.
    pub(crate) fn conn_removed(&mut self) {
        self.conns -= 1;
        self.mem_used -= self.mem_per_conn;
    }

    /// Connection records held by every node charging these resources.
    pub(crate) fn conns(&self) -> u64 {
        self.conns
    }

    /// Removes both hardware entries of `conn` at `now`, each delete a rule command on the SoC
    /// ([`SocWork::Rule`]: the entries go whatever the SoC's queue, and its time is charged
    /// where there is room); returns how many there were.
    pub(crate) fn remove_entries(&mut self, now: Instant, conn: ConnId) -> u64 {
        let mut removed = 0;
        for side in [Side::Orig, Side::Reply] {
            if self.hw.remove(&HwKey { conn, side }) {
                removed += 1;
                self.mem_used -= self.mem_per_entry;
            }
        }
        if removed > 0 {
            self.soc(now, SocWork::Rule, removed as u32);
        }
        removed
    }

    /// Installs an entry if memory and the table have room; `None` when refused.
    pub(crate) fn insert_entry(
        &mut self,
        now: Instant,
        key: HwKey,
        rule: HwRule,
    ) -> Option<Inserted<HwKey>> {
        if self.mem_used + self.mem_per_entry > self.mem_bytes {
            return None;
        }
        let outcome = self.hw.insert(now, key, rule).ok()?;
        if matches!(outcome, Inserted::Fresh) {
            self.mem_used += self.mem_per_entry;
        }
        Some(outcome)
    }

    /// An entry's hardware counters.
    pub(crate) fn entry(&self, key: &HwKey) -> Option<EntryStats> {
        self.hw.stats(key)
    }

    /// Packets both of `conn`'s hardware entries have matched since they were installed.
    pub(crate) fn entry_packets(&self, conn: ConnId) -> u64 {
        [Side::Orig, Side::Reply]
            .iter()
            .filter_map(|side| self.hw.stats(&HwKey { conn, side: *side }))
            .map(|e| e.packets)
            .sum()
    }

    /// Entries installed.
    pub(crate) fn entries(&self) -> usize {
        self.hw.len()
    }

    /// Entries the table holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.hw.capacity()
    }

    /// Entries neither installed nor promised to an insert on its way.
    pub(crate) fn free_entries(&self) -> usize {
        let free = self.hw.capacity() - self.hw.len();
        free - self.promised.min(free)
    }

    /// Memory in use, bytes.
    pub(crate) fn mem_used(&self) -> u64 {
        self.mem_used
    }

    /// Utilisation of the fast path, the SoC and the phy vNIC since the last call, and of the
    /// table and memory now. Starts the next measurement window.
    pub(crate) fn take_utils(&mut self, now: Instant) -> Utils {
        let hw = self.hw.take_util(now);
        let soc = self.soc.take_util(ps(now));
        let table = self.hw.len() as f64 / self.hw.capacity() as f64;
        let mem = self.mem_used as f64 / self.mem_bytes as f64;
        self.to_host.take_util(ps(now));
        Utils {
            hw,
            soc,
            table,
            mem,
        }
    }

    /// Checks the table and queue bounds, and that memory in use is what the connection
    /// records and the installed entries cost.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.check_table()?;
        self.hw.check_invariants()?;
        self.soc.check_invariants()?;
        self.insert_engine.check_invariants()?;
        let mem = self.conns * self.mem_per_conn + self.hw.len() as u64 * self.mem_per_entry;
        if mem != self.mem_used {
            return Err(format!("dpu: memory {} != recomputed {mem}", self.mem_used));
        }
        Ok(())
    }

    /// Cheap checks: table within capacity, memory within what the records could use.
    pub(crate) fn check_cheap(&self) -> Result<(), String> {
        self.check_table()?;
        if self.mem_used > self.mem_bytes + self.mem_per_conn * self.conns {
            return Err("dpu: memory accounting ran away".into());
        }
        Ok(())
    }

    fn check_table(&self) -> Result<(), String> {
        if self.hw.len() > self.hw.capacity() {
            return Err(format!(
                "dpu: hw table {} > capacity {}",
                self.hw.len(),
                self.hw.capacity()
            ));
        }
        Ok(())
    }
}
