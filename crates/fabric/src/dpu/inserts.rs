//! The DPU's insertion queue: rule inserts wait for the insertion engine (one server at
//! `insert_rate_limit` behind `insert_queue_max`, one of the DPU's [`Resources`] because the
//! rate is the whole DPU's), then for `insert_latency`, before the hardware is asked to take
//! the entry. What happens when the entry is due (live, refused by a full table, stale because
//! the connection closed) is the node's business; this object only delays and keeps the order
//! of the node's own inserts.
//!
//! [`Resources`]: super::resources::Resources

use std::collections::VecDeque;
use std::time::Duration;

use spillway_vswitch::Instant;

use crate::hw::HwKey;
use crate::links::at_ps;
use crate::params::FabricParams;
use crate::server::Admitted;

/// An insert on its way to the hardware.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PendingInsert {
    /// When the hardware executes it.
    pub(crate) due: Instant,
    /// The entry.
    pub(crate) key: HwKey,
    /// Part of a recall from the plane (its completion answers the recall).
    pub(crate) recall: bool,
}

/// The insertion queue. See the module doc.
#[derive(Debug)]
pub(crate) struct InsertQueue {
    latency: Duration,
    pending: VecDeque<PendingInsert>,
}

impl InsertQueue {
    pub(crate) fn new(f: &FabricParams) -> InsertQueue {
        let d = &f.dpu;
        InsertQueue {
            latency: d.insert_latency,
            // Grows to `insert_queue_max` under load rather than reserving it up front: a
            // large queue bound must not cost its whole memory at start.
            pending: VecDeque::with_capacity(d.insert_queue_max.min(1 << 16) as usize),
        }
    }

    /// Queues an insert of `key` that the insertion engine took as `engine`; false when the
    /// engine's queue was full.
    pub(crate) fn push(&mut self, engine: Admitted, key: HwKey, recall: bool) -> bool {
        if engine.count == 0 {
            return false;
        }
        self.pending.push_back(PendingInsert {
            due: at_ps(engine.finish_ps) + self.latency,
            key,
            recall,
        });
        true
    }

    /// The next insert due at or before `now`, in order.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<PendingInsert> {
        if self.pending.front()?.due > now {
            return None;
        }
        self.pending.pop_front()
    }

    /// When the next insert is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.pending.front().map(|p| p.due)
    }
}
