//! The spill plane's process: the [`SpillPlane`] node and its life (started, stopped,
//! killed), numbered by generation.
//!
//! Every start of the process is a new generation, and so is every stop (which cancels a start
//! still under way). A message carries the generation it was sent to or from; the driver uses
//! [`PlaneProcess::is_current`] and [`PlaneProcess::died_before`] to decide whether it is lost
//! with a dead process.

use spillway_fabric::params::FabricParams;
use spillway_fabric::spill::{SpillCounters, SpillPlane};
use spillway_fabric::stats::{Drops, LatencyHist};
use spillway_fabric::types::{ConnId, PlaneSlot};
use std::collections::VecDeque;

use spillway_vswitch::Instant;

/// The plane's process and its generations.
#[derive(Debug)]
pub(super) struct PlaneProcess {
    node: SpillPlane,
    /// The current generation (0 before the first start).
    generation: u32,
    /// Whether the current generation's process is up.
    running: bool,
    /// When each generation's process died, by generation.
    killed_at: Vec<Option<Instant>>,
    /// The running process is stopped (a stall) until then.
    frozen_until: Option<Instant>,
    /// Messages that reached it while it was stopped, in arrival order (parked in the links):
    /// what waits in its vNIC set.
    deferred: VecDeque<u32>,
}

impl PlaneProcess {
    pub(super) fn new(params: &FabricParams) -> PlaneProcess {
        PlaneProcess {
            node: SpillPlane::new(params),
            generation: 0,
            running: false,
            killed_at: vec![None],
            frozen_until: None,
            deferred: VecDeque::new(),
        }
    }

    /// The node (its counters and records outlive its process: they are its metrics).
    pub(super) fn node(&self) -> &SpillPlane {
        &self.node
    }

    /// The node, if its process is up.
    pub(super) fn running_node(&mut self) -> Option<&mut SpillPlane> {
        self.running.then_some(&mut self.node)
    }

    /// Whether the current generation's process is up.
    pub(super) fn running(&self) -> bool {
        self.running
    }

    /// Whether the running process is stopped at `now` (until its `Thaw`, at the end of the
    /// stall inclusive: a message arriving at that instant before the thaw waits behind those
    /// that arrived earlier).
    pub(super) fn frozen(&self, now: Instant) -> bool {
        self.frozen_until.is_some_and(|t| self.running && now <= t)
    }

    /// A message (parked in the links at `parked`) reached the stopped process: it waits.
    pub(super) fn defer(&mut self, parked: u32) {
        self.deferred.push_back(parked);
    }

    /// The stall that ends at `now` ends: the messages that waited, in the order they
    /// arrived. Nothing if the process was not stalled until `now` (a `Thaw` of an earlier
    /// process's stall, or of one a later stall extended).
    pub(super) fn thaw(&mut self, now: Instant) -> VecDeque<u32> {
        if self.frozen_until != Some(now) {
            return VecDeque::new();
        }
        self.frozen_until = None;
        core::mem::take(&mut self.deferred)
    }

    /// The messages that waited for a process that was stopped or killed meanwhile: lost.
    pub(super) fn take_deferred(&mut self) -> VecDeque<u32> {
        core::mem::take(&mut self.deferred)
    }

    /// A fault stops the running process until `until`; false if none was running.
    pub(super) fn freeze(&mut self, until: Instant) -> bool {
        if !self.running {
            return false;
        }
        self.frozen_until = Some(until);
        true
    }

    /// The current generation.
    pub(super) fn generation(&self) -> u32 {
        self.generation
    }

    /// The DPU asked for a process: a new generation, starting; returns it.
    pub(super) fn begin_start(&mut self) -> u32 {
        self.generation += 1;
        self.killed_at.push(None);
        self.generation
    }

    /// Generation `generation` finished starting with `workers` workers; false (and nothing
    /// happens) if it was cancelled meanwhile.
    pub(super) fn up(&mut self, now: Instant, generation: u32, workers: u32) -> bool {
        if generation != self.generation {
            return false;
        }
        self.node.start(now, workers);
        self.running = true;
        true
    }

    /// The DPU stopped the process (or cancelled its start).
    pub(super) fn stop(&mut self, now: Instant) {
        self.frozen_until = None;
        if self.running {
            self.node.stop(now);
        }
        self.running = false;
        let g = self.generation as usize;
        if self.killed_at[g].is_none() {
            self.killed_at[g] = Some(now);
        }
        // A plane still starting is cancelled: its PlaneUp is for an older generation.
        self.generation += 1;
        self.killed_at.push(Some(now));
    }

    /// A fault kills the running process; false if none was running.
    pub(super) fn kill(&mut self, now: Instant) -> bool {
        if !self.running {
            return false;
        }
        self.node.stop(now);
        self.running = false;
        self.frozen_until = None;
        self.killed_at[self.generation as usize] = Some(now);
        true
    }

    /// Whether a message for generation `generation` finds its process up.
    pub(super) fn is_current(&self, generation: u32) -> bool {
        generation == self.generation && self.running
    }

    /// Whether generation `generation` had died when a message left it at `depart`.
    pub(super) fn died_before(&self, generation: u32, depart: Instant) -> bool {
        let dead = self.killed_at.get(generation as usize).copied().flatten();
        dead.is_some_and(|k| depart > k)
    }
}

/// The DPU's two plane slots, each with its process (the second runs only with warm standby,
/// `host.warm_standby`). A plane's counters outlive its process, so the run's figures sum
/// both slots.
#[derive(Debug)]
pub(super) struct Planes {
    slots: [PlaneProcess; 2],
}

impl Planes {
    pub(super) fn new(params: &FabricParams) -> Planes {
        Planes {
            slots: [PlaneProcess::new(params), PlaneProcess::new(params)],
        }
    }

    /// The process of `slot`.
    pub(super) fn get(&self, slot: PlaneSlot) -> &PlaneProcess {
        &self.slots[slot.index()]
    }

    /// The process of `slot`, to change.
    pub(super) fn get_mut(&mut self, slot: PlaneSlot) -> &mut PlaneProcess {
        &mut self.slots[slot.index()]
    }

    /// Both slots with their processes.
    pub(super) fn each(&self) -> impl Iterator<Item = (PlaneSlot, &PlaneProcess)> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, p)| (PlaneSlot(i as u8), p))
    }

    /// The nodes whose process is up.
    pub(super) fn running(&self) -> Vec<&SpillPlane> {
        self.slots
            .iter()
            .filter(|p| p.running())
            .map(|p| p.node())
            .collect()
    }

    /// Both nodes' counters, summed. A slot never started (the second, without warm standby)
    /// adds nothing and is not read: conservation reads this after every event.
    pub(super) fn counters(&self) -> SpillCounters {
        let mut c = self.slots[0].node().counters();
        if self.slots[1].generation() > 0 {
            c.add(&self.slots[1].node().counters());
        }
        c
    }

    /// Both nodes' drops (a slot never started is not read, as in [`Planes::counters`]).
    pub(super) fn drops(&self) -> Drops {
        let d = self.slots[0].node().drops();
        if self.slots[1].generation() > 0 {
            d.merged(&self.slots[1].node().drops())
        } else {
            d
        }
    }

    /// Delivery, loss and latency by tenant, of both nodes.
    pub(super) fn tenant_stats(&self) -> spillway_fabric::stats::TenantStats {
        let mut t = self.slots[0].node().tenant_stats();
        t.merge(&self.slots[1].node().tenant_stats());
        t
    }

    /// Latency of the packets both nodes delivered themselves.
    pub(super) fn latency(&self) -> LatencyHist {
        let mut h = self.slots[0].node().latency();
        h.merge(&self.slots[1].node().latency());
        h
    }

    /// Workers of the running planes.
    pub(super) fn workers(&self) -> u32 {
        self.slots
            .iter()
            .filter(|p| p.running())
            .map(|p| p.node().workers())
            .sum()
    }

    /// The placement policy's name (every plane runs the same one).
    pub(super) fn policy_name(&self) -> &'static str {
        self.slots[0].node().policy_name()
    }

    /// The first connection a packet of which found no state in a plane.
    pub(super) fn first_no_state(&self) -> Option<ConnId> {
        self.slots.iter().find_map(|p| p.node().first_no_state())
    }
}
