//! Duplicate suppression for the reliable control channel's deletes: the plane retransmits a
//! `Delete` until it is acknowledged, so the DPU remembers what each sequence number did (the
//! state it handed back, if any) and answers a retransmission with the same ack instead of
//! acting twice.

use std::collections::BTreeMap;

use crate::types::ConnState;

/// How many sequence numbers are remembered. The plane never has more than a window of
/// unacknowledged deletes outstanding, so older ones can go.
const SEEN_MAX: usize = 65_536;

/// Deletes already executed, by sequence number. See the module doc.
#[derive(Debug, Default)]
pub(crate) struct DeleteLog {
    seen: BTreeMap<u64, Option<ConnState>>,
}

impl DeleteLog {
    /// What the delete `seq` answered, if it was executed before.
    pub(crate) fn answered(&self, seq: u64) -> Option<Option<ConnState>> {
        self.seen.get(&seq).copied()
    }

    /// Records the answer to delete `seq`, forgetting the oldest beyond the bound.
    pub(crate) fn record(&mut self, seq: u64, state: Option<ConnState>) {
        self.seen.insert(seq, state);
        while self.seen.len() > SEEN_MAX {
            self.seen.pop_first();
        }
    }
}
