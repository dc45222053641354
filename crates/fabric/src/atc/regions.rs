//! The authority: each VM's mapped regions as its device model reports them, and the per-VM
//! epochs that every change bumps. The cache in `cache.rs` reads it on fills and for the epoch
//! check; nothing else changes it.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::{AtcEpoch, AtcError, Iova, Mapping, VmId, range_end};

/// The authority: each VM's mapped regions, as its device model says, and their epochs.
#[derive(Clone, Debug, Default)]
pub struct RegionTable {
    /// Keyed by `(vm, start)`; a VM's regions never overlap.
    regions: BTreeMap<(VmId, Iova), Mapping>,
    /// Each VM's current epoch; kept after `remove_vm` so epochs never repeat for a VM.
    epochs: BTreeMap<VmId, AtcEpoch>,
    /// The last epoch handed out (table-wide, so it only grows).
    epoch_last: AtcEpoch,
}

impl RegionTable {
    /// An empty authority.
    pub fn new() -> Self {
        Self::default()
    }

    /// The VM's current epoch (`AtcEpoch(0)` for a VM never mapped).
    pub fn epoch(&self, vm: VmId) -> AtcEpoch {
        self.epochs.get(&vm).copied().unwrap_or_default()
    }

    fn bump(&mut self, vm: VmId) {
        self.epoch_last.0 += 1;
        self.epochs.insert(vm, self.epoch_last);
    }

    /// The VM's regions, in IOVA order.
    pub fn regions(&self, vm: VmId) -> impl Iterator<Item = &Mapping> + Clone + '_ {
        self.regions
            .range((vm, Iova(0))..=(vm, Iova(u64::MAX)))
            .map(|(_, m)| m)
    }

    /// The VM's regions intersecting `[iova, end)`, in IOVA order.
    pub(super) fn intersecting(
        &self,
        vm: VmId,
        iova: Iova,
        end: u64,
    ) -> impl Iterator<Item = &Mapping> + Clone + '_ {
        // Only the region starting at or before `iova` can begin before the range.
        let first = self
            .regions
            .range(..=(vm, iova))
            .next_back()
            .filter(|((v, _), m)| *v == vm && m.iova_end() > iova.0)
            .map_or(iova, |(_, m)| m.iova);
        self.regions
            .range((
                Bound::Included((vm, first)),
                Bound::Excluded((vm, Iova(end))),
            ))
            .map(|(_, m)| m)
    }

    /// Adds a region to `vm`. Errors: zero length, IOVA or host overflow, overlap with one of the
    /// VM's regions (named in the error). Bumps the VM's epoch.
    pub fn map(&mut self, vm: VmId, mapping: Mapping) -> Result<(), AtcError> {
        let end = range_end(vm, mapping.iova, mapping.len)?;
        if mapping.host.0.checked_add(mapping.len).is_none() {
            return Err(AtcError::HostOverflow {
                vm,
                host: mapping.host,
                len: mapping.len,
            });
        }
        if let Some(existing) = self.intersecting(vm, mapping.iova, end).next() {
            return Err(AtcError::Overlap {
                vm,
                new: mapping.range(),
                existing: existing.range(),
            });
        }
        self.regions.insert((vm, mapping.iova), mapping);
        self.bump(vm);
        Ok(())
    }

    /// Removes every whole region of `vm` that intersects `[iova, iova + len)` and returns them in
    /// IOVA order (regions are never split). Bumps the VM's epoch if anything was removed.
    pub fn unmap(&mut self, vm: VmId, iova: Iova, len: u64) -> Result<Vec<Mapping>, AtcError> {
        let end = range_end(vm, iova, len)?;
        let removed: Vec<Mapping> = self.intersecting(vm, iova, end).copied().collect();
        for m in &removed {
            self.regions.remove(&(vm, m.iova));
        }
        if !removed.is_empty() {
            self.bump(vm);
        }
        Ok(removed)
    }

    /// Removes all of `vm`'s regions and returns them in IOVA order. Bumps the VM's epoch if it
    /// had any.
    pub fn remove_vm(&mut self, vm: VmId) -> Vec<Mapping> {
        let removed: Vec<Mapping> = self.regions(vm).copied().collect();
        for m in &removed {
            self.regions.remove(&(vm, m.iova));
        }
        if !removed.is_empty() {
            self.bump(vm);
        }
        removed
    }

    /// Checks: keys match regions, no region is empty or overflows, a VM's regions do not
    /// overlap, no VM's epoch exceeds the last one handed out.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut prev: Option<(VmId, Mapping)> = None;
        for (&(vm, iova), m) in &self.regions {
            if m.iova != iova {
                return Err(format!(
                    "{vm:?}: region keyed at {iova:?} starts at {:?}",
                    m.iova
                ));
            }
            if m.len == 0 || iova.0.checked_add(m.len).is_none() {
                return Err(format!("{vm:?}: region {m:?} is empty or overflows"));
            }
            if m.host.0.checked_add(m.len).is_none() {
                return Err(format!("{vm:?}: region {m:?} overflows host space"));
            }
            if let Some((pvm, p)) = prev
                && pvm == vm
                && p.iova_end() > m.iova.0
            {
                return Err(format!("{vm:?}: regions {p:?} and {m:?} overlap"));
            }
            if self.epoch(vm) == AtcEpoch(0) {
                return Err(format!("{vm:?}: has regions but no epoch"));
            }
            prev = Some((vm, *m));
        }
        if let Some((vm, e)) = self.epochs.iter().find(|(_, e)| **e > self.epoch_last) {
            return Err(format!(
                "{vm:?}: epoch {e:?} beyond last {:?}",
                self.epoch_last
            ));
        }
        Ok(())
    }
}
