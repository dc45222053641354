//! The spill plane's process: the [`SpillPlane`] node and its life (started, stopped,
//! killed), numbered by generation.
//!
//! Every start of the process is a new generation, and so is every stop (which cancels a start
//! still under way). A message carries the generation it was sent to or from; the driver uses
//! [`PlaneProcess::is_current`] and [`PlaneProcess::died_before`] to decide whether it is lost
//! with a dead process.

use spillway_fabric::params::FabricParams;
use spillway_fabric::spill::SpillPlane;
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
}

impl PlaneProcess {
    pub(super) fn new(params: &FabricParams) -> PlaneProcess {
        PlaneProcess {
            node: SpillPlane::new(params),
            generation: 0,
            running: false,
            killed_at: vec![None],
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
