//! The event queue: virtual-time events ordered by `(time, sequence number)`, and the one
//! armed timeout of each node.
//!
//! The sequence number breaks ties between events at the same instant in the order they were
//! scheduled, which is what makes a run reproducible: nothing else decides the order. The
//! queue also remembers the earliest timeout it holds for each node, so that a node asking
//! for the same or a later deadline again does not flood the heap with duplicates, and a stale
//! timer event (superseded by an earlier deadline) is recognised and skipped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use spillway_vswitch::Instant;

/// What happens at an event. Indices name a slot of the unit that owns the thing: a flow or
/// short connection of the sources, a message parked on the links, a scenario entry.
#[derive(Clone, Copy, Debug)]
pub(super) enum EvKind {
    /// The next step of long flow `i` of the sources.
    Flow(u32),
    /// The next packet of the short connection in slot `i` of the sources.
    Short(u32),
    /// The next connection of CPS group `i` of the scenario.
    CpsArrival(u16),
    /// A message arriving at the plane, parked in slot `i` of the links (kept out of the heap
    /// so that heap entries stay small: the heap is the simulator's hottest structure).
    ToSpill(u32),
    /// A message arriving at the DPU, parked in slot `i` of the links.
    ToDpu(u32),
    DpuTimer,
    /// The timer of the plane in slot `i`.
    SpillTimer(u8),
    /// The plane process of generation `plane` in slot `slot` has started with `workers`
    /// workers.
    PlaneUp {
        slot: u8,
        plane: u32,
        workers: u32,
    },
    Sample,
    /// The stall of the plane in slot `i` ends: it reads what waited, its timers run again.
    Thaw(u8),
    /// Host load entry `i` of the scenario takes effect.
    HostLoad(u16),
    /// Fault `i` of the scenario is injected.
    Fault(u16),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Ev {
    pub(super) at: Instant,
    seq: u64,
    pub(super) kind: EvKind,
}

impl PartialEq for Ev {
    fn eq(&self, o: &Ev) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Ev) -> Option<core::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    fn cmp(&self, o: &Ev) -> core::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// The pending events of a run.
#[derive(Debug)]
pub(super) struct EventQueue {
    heap: BinaryHeap<Reverse<Ev>>,
    /// The sequence number of the last event scheduled.
    seq: u64,
    /// The DPU's armed timeout, if one is queued.
    dpu_timer: Option<Instant>,
    /// The plane's armed timeout, if one is queued.
    spill_timer: [Option<Instant>; 2],
}

impl EventQueue {
    pub(super) fn new() -> EventQueue {
        EventQueue {
            heap: BinaryHeap::with_capacity(1 << 16),
            seq: 0,
            dpu_timer: None,
            spill_timer: [None; 2],
        }
    }

    /// Schedules `kind` at `at`, after every event already scheduled for the same instant.
    pub(super) fn push(&mut self, at: Instant, kind: EvKind) {
        self.seq += 1;
        self.heap.push(Reverse(Ev {
            at,
            seq: self.seq,
            kind,
        }));
    }

    /// The earliest event, removed.
    pub(super) fn pop(&mut self) -> Option<Ev> {
        self.heap.pop().map(|Reverse(e)| e)
    }

    /// Every pending event, in no particular order.
    pub(super) fn pending(&self) -> impl Iterator<Item = &EvKind> {
        self.heap.iter().map(|Reverse(e)| &e.kind)
    }

    /// Arms the DPU's timeout at `deadline` unconditionally (the first one of a run).
    pub(super) fn arm_dpu_initial(&mut self, deadline: Option<Instant>) {
        self.dpu_timer = deadline;
        if let Some(t) = deadline {
            self.push(t, EvKind::DpuTimer);
        }
    }

    /// Arms the DPU's timeout at `deadline` if it is earlier than the one queued (never
    /// before `now`).
    pub(super) fn arm_dpu(&mut self, deadline: Option<Instant>, now: Instant) {
        if let Some(t) = deadline
            && self.dpu_timer.is_none_or(|s| t < s)
        {
            self.dpu_timer = Some(t);
            self.push(t.max(now), EvKind::DpuTimer);
        }
    }

    /// Arms the plane's timeout at `deadline` if it is earlier than the one queued.
    pub(super) fn arm_spill(&mut self, slot: usize, deadline: Option<Instant>, now: Instant) {
        if let Some(t) = deadline
            && self.spill_timer[slot].is_none_or(|s| t < s)
        {
            self.spill_timer[slot] = Some(t);
            self.push(t.max(now), EvKind::SpillTimer(slot as u8));
        }
    }

    pub(super) fn fire_dpu(&mut self, at: Instant) -> bool {
        let armed = self.dpu_timer == Some(at);
        if armed {
            self.dpu_timer = None;
        }
        armed
    }

    /// Whether a `SpillTimer` event scheduled for `at` is the armed one; if so it is disarmed.
    pub(super) fn fire_spill(&mut self, slot: usize, at: Instant) -> bool {
        let armed = self.spill_timer[slot] == Some(at);
        if armed {
            self.spill_timer[slot] = None;
        }
        armed
    }

    pub(super) fn disarm_spill(&mut self, slot: usize) {
        self.spill_timer[slot] = None;
    }
}
