//! vATC: the address translation cache the spill plane uses to copy a packet straight into a
//! tenant VM's receive buffer.
//!
//! ## What it models
//!
//! A VM's receive descriptors carry device addresses ([`Iova`]s). Before the spill plane may copy
//! a packet into such a buffer it must translate `(VmId, [iova, iova + len))` into host addresses
//! ([`HostAddr`]) inside that VM's registered memory, with write permission. Two types split the
//! job, as an IOMMU and its IOTLB do (the design follows rust-vmm `vm-memory`'s `iommu` module):
//!
//! - [`RegionTable`] is the **authority**: what the VM's device model (its IOMMU) says is mapped.
//!   Per VM it holds non-overlapping [`Mapping`]s. Every change to a VM's regions bumps that VM's
//!   [`AtcEpoch`].
//! - [`Atc`] is the bounded **cache** the spill plane keeps. Entries are copies of authority
//!   regions, keyed by `(VmId, Iova)` and stamped with the VM's epoch at fill time.
//!
//! This is a model over abstract addresses: translations are numbers. The real-time driver turns
//! them into pointers into the VM's memfd mapping, so the module needs no `unsafe`.
//!
//! ## Translation and IOTLB-style miss reporting
//!
//! [`Atc::translate`] walks the asked range in IOVA order. On a hit it returns a [`Translation`]:
//! up to [`SEGMENTS_MAX`] [`Segment`]s, contiguous in IOVA order, covering exactly the asked range,
//! in a fixed array (the hit path never allocates). Otherwise it returns one of, in this order:
//!
//! 1. [`AtcError::Miss`]: the [`AtcMiss`] names the sub-ranges not covered by a fresh entry,
//!    ascending and disjoint. Up to [`MISS_RANGES_MAX`] gaps the list is exact
//!    ([`AtcMiss::exact`]); beyond that the last reported range runs to the end of the asked
//!    range, a superset that still makes fill-and-retry converge. The caller resolves each range
//!    with [`Atc::fill`] and retries.
//! 2. [`AtcError::Permission`]: every byte is cached but an entry lacks the needed [`Perm`]; this
//!    is final (filling again would give the same answer), never a miss.
//! 3. [`AtcError::TooManySegments`]: the range spans more than [`SEGMENTS_MAX`] regions; the
//!    caller splits the buffer.
//!
//! Miss resolution on a real ATC is a command whose completion comes back later (a translation
//! request to the device model). Here [`Atc::fill`] is a plain method taking the authority: the
//! node that owns the cache emits the request and the driver calls `fill` when the completion
//! arrives.
//!
//! ## Known-unmapped ranges (the negative cache)
//!
//! A descriptor whose address lies outside every region misses forever: filling finds nothing to
//! cache, so every later packet would miss and ask again. [`Atc::fill_map`] takes the VM's
//! *complete* map as the authority reported it at an epoch and also remembers, for each part of
//! the asked range that no region covers, the whole gap between the neighbouring regions as
//! unmapped at that epoch. A translation that misses and touches such a gap returns
//! [`AtcError::Unmapped`] (`atc.unmapped`): final at this epoch, like a permission denial, so
//! the caller returns the buffer instead of asking again. A bad address thus costs one request
//! per (VM, gap) per epoch, not one per packet. The negative entries follow the epoch rule and
//! the invalidations below, like the positive ones; at most [`UNMAPPED_PER_VM_MAX`] per VM and
//! [`AtcConfig::entries_max`] in all, the oldest replaced first. The hit path never looks at
//! them: they are consulted only when a translation would otherwise miss.
//!
//! ## Invalidation and the epoch rule
//!
//! Two mechanisms keep a stale translation from ever being used:
//!
//! - **Explicit invalidation**: [`Atc::invalidate`] drops every entry of the VM intersecting a
//!   range, [`Atc::invalidate_vm`] every entry of a VM (its port was torn down),
//!   [`Atc::invalidate_all`] everything.
//! - **Epochs**: `translate` reads the VM's current epoch from the authority (in the real driver a
//!   word in shared memory the device model publishes). An entry whose epoch differs from it is
//!   never used: it counts as a miss, and every such entry of that VM is dropped (`atc.stale`). So
//!   after any `map`, `unmap` or `remove_vm` the VM's old entries are dead even if nobody
//!   invalidated them; entries are refilled, never patched. Epochs come from one table-wide
//!   counter and a removed VM keeps its epoch, so a VM that comes back can never revive an entry.
//!
//! ## Isolation by construction
//!
//! Entries are keyed by VM and `fill(vm, ..)` reads only `vm`'s regions, so `translate(vm, ..)`
//! can only return host ranges of regions that belong to `vm` and were current at the epoch the
//! authority still reports.
//!
//! ## Eviction
//!
//! The cache holds at most [`AtcConfig::entries_max`] entries. Every use (fill or hit) stamps an
//! entry with the next value of a use counter (never a clock). When a fill needs room it evicts
//! the entry with the smallest stamp, ties broken by `(VmId, Iova)` order (`atc.evict`). Eviction
//! scans the entries; it runs on the fill (slow) path only.
//!
//! ## Example
//!
//! ```
//! use spillway_fabric::atc::{Atc, AtcConfig, AtcError, HostAddr, Iova, Mapping, Perm, RegionTable, VmId};
//!
//! let vm = VmId(7);
//! let mut table = RegionTable::new();
//! table.map(vm, Mapping { iova: Iova(0x1000), len: 0x1000, host: HostAddr(0x9_0000), perm: Perm::RW })?;
//! let mut atc = Atc::new(AtcConfig { entries_max: 16 })?;
//!
//! // Cold cache: the miss names exactly the range to resolve.
//! let miss = match atc.translate(&table, vm, Iova(0x1100), 64, Perm::WRITE) {
//!     Err(AtcError::Miss(miss)) => miss,
//!     other => panic!("expected a miss, got {other:?}"),
//! };
//! for r in miss.missing() {
//!     atc.fill(&table, vm, r.start, r.len)?;
//! }
//! let t = atc.translate(&table, vm, Iova(0x1100), 64, Perm::WRITE)?;
//! assert_eq!(t.segments()[0].host, HostAddr(0x9_0100));
//!
//! // The authority changes: the un-invalidated entry is stale and never used again.
//! table.unmap(vm, Iova(0x1000), 1)?;
//! assert!(matches!(atc.translate(&table, vm, Iova(0x1100), 64, Perm::WRITE), Err(AtcError::Miss(_))));
//! assert_eq!(atc.counters().stale, 1);
//! # Ok::<(), AtcError>(())
//! ```

use std::collections::BTreeMap;
use std::ops::Bound;

/// A tenant VM, as the vATC knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VmId(pub u32);

/// A device (I/O virtual) address, as a VM's receive descriptor carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Iova(pub u64);

/// A host address inside a VM's registered memory (an offset the real-time driver turns into a
/// pointer into the VM's memfd mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostAddr(pub u64);

/// The version of one VM's regions in the authority; an entry is usable only at the epoch it was
/// filled at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AtcEpoch(pub u64);

/// Access permissions of a region, and the access a translation needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Perm {
    /// The device may read (transmit buffers).
    pub read: bool,
    /// The device may write (receive buffers: what the spill plane needs).
    pub write: bool,
}

impl Perm {
    /// No access.
    pub const NONE: Perm = Perm {
        read: false,
        write: false,
    };
    /// Read only.
    pub const READ: Perm = Perm {
        read: true,
        write: false,
    };
    /// Write only.
    pub const WRITE: Perm = Perm {
        read: false,
        write: true,
    };
    /// Read and write.
    pub const RW: Perm = Perm {
        read: true,
        write: true,
    };

    /// Whether `self` grants every access in `need`.
    pub fn allows(self, need: Perm) -> bool {
        (self.read || !need.read) && (self.write || !need.write)
    }
}

/// A half-open IOVA range `[start, start + len)`. Ranges this module hands out are never empty
/// and their end never overflows `u64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IovaRange {
    /// First address.
    pub start: Iova,
    /// Length in bytes.
    pub len: u64,
}

impl IovaRange {
    /// One past the last address (saturating, for ranges built by hand).
    pub fn end(self) -> u64 {
        self.start.0.saturating_add(self.len)
    }
}

/// One region of a VM's memory as the authority maps it: `[iova, iova + len)` is backed by
/// `[host, host + len)` with `perm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First device address.
    pub iova: Iova,
    /// Length in bytes (non-zero).
    pub len: u64,
    /// Host address backing `iova`.
    pub host: HostAddr,
    /// What the device may do.
    pub perm: Perm,
}

impl Mapping {
    /// The IOVA range this region covers.
    pub fn range(&self) -> IovaRange {
        IovaRange {
            start: self.iova,
            len: self.len,
        }
    }

    fn iova_end(&self) -> u64 {
        self.iova.0 + self.len
    }
}

/// Errors of the vATC: bad arguments, authority conflicts and the translation outcomes other than
/// a hit. `Copy`, since translation errors are data-path values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AtcError {
    /// A range of zero bytes.
    #[error("{vm:?}: zero-length range at {iova:?}")]
    ZeroLength {
        /// The VM.
        vm: VmId,
        /// Where the range starts.
        iova: Iova,
    },
    /// `iova + len` does not fit in 64 bits.
    #[error("{vm:?}: IOVA range {iova:?} + {len:#x} overflows")]
    IovaOverflow {
        /// The VM.
        vm: VmId,
        /// Start of the range.
        iova: Iova,
        /// Its length.
        len: u64,
    },
    /// `host + len` does not fit in 64 bits.
    #[error("{vm:?}: host range {host:?} + {len:#x} overflows")]
    HostOverflow {
        /// The VM.
        vm: VmId,
        /// Start of the host range.
        host: HostAddr,
        /// Its length.
        len: u64,
    },
    /// A new region overlaps one the VM already has.
    #[error("{vm:?}: new region {new:?} overlaps existing region {existing:?}")]
    Overlap {
        /// The VM.
        vm: VmId,
        /// The region being mapped.
        new: IovaRange,
        /// The first existing region it overlaps.
        existing: IovaRange,
    },
    /// Part of the range has no fresh cache entry; fill [`AtcMiss::missing`] and retry.
    #[error("{0}")]
    Miss(AtcMiss),
    /// A cached region does not grant the access asked for; final, not a miss.
    #[error("{vm:?}: {range:?} grants {have:?}, needs {need:?}")]
    Permission {
        /// The VM.
        vm: VmId,
        /// The part of the asked range in the first region that denies it.
        range: IovaRange,
        /// What the region grants.
        have: Perm,
        /// What was asked for.
        need: Perm,
    },
    /// The range spans more regions than a [`Translation`] holds.
    #[error("{vm:?}: {range:?} spans more than {segments_max} regions")]
    TooManySegments {
        /// The VM.
        vm: VmId,
        /// The asked range.
        range: IovaRange,
        /// [`SEGMENTS_MAX`].
        segments_max: usize,
    },
    /// Part of the range is mapped nowhere: the authority's map at this epoch has a gap there
    /// ([`Atc::fill_map`]). Final until the VM's map changes; filling again would not help.
    #[error("{vm:?}: {range:?} is mapped nowhere at this epoch")]
    Unmapped {
        /// The VM.
        vm: VmId,
        /// The known-unmapped gap the asked range touches.
        range: IovaRange,
    },
    /// A configuration value is out of range.
    #[error("invalid vATC config: {field} = {value}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

/// Known-unmapped ranges ([`Atc::fill_map`]) kept per VM: a VM's map of `R` regions has at most
/// `R + 1` gaps, and a VM port registers 3 regions.
pub const UNMAPPED_PER_VM_MAX: usize = 8;

/// How many segments a [`Translation`] holds.
pub const SEGMENTS_MAX: usize = 4;
/// How many missing ranges an [`AtcMiss`] reports exactly.
pub const MISS_RANGES_MAX: usize = 4;

/// A translation miss: which parts of the asked range have no fresh entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{vm:?}: translation miss for {range:?}: {count} missing range(s)")]
pub struct AtcMiss {
    /// The VM.
    pub vm: VmId,
    /// The asked range.
    pub range: IovaRange,
    missing: [IovaRange; MISS_RANGES_MAX],
    count: u8,
    exact: bool,
}

impl AtcMiss {
    /// The missing sub-ranges: non-empty, inside the asked range, ascending and disjoint.
    pub fn missing(&self) -> &[IovaRange] {
        &self.missing[..usize::from(self.count)]
    }

    /// True when [`AtcMiss::missing`] is exactly the uncovered part of the asked range; false when
    /// there were more than [`MISS_RANGES_MAX`] gaps and the last range was extended to the end.
    pub fn exact(&self) -> bool {
        self.exact
    }
}

/// One piece of a translation: `[iova, iova + len)` is at `[host, host + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Device address of the piece.
    pub iova: Iova,
    /// Host address of the piece.
    pub host: HostAddr,
    /// Length in bytes.
    pub len: u64,
}

/// A successful translation: segments contiguous in IOVA order covering exactly the asked range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    segments: [Segment; SEGMENTS_MAX],
    count: u8,
}

impl Translation {
    /// The segments, in IOVA order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments[..usize::from(self.count)]
    }

    /// Total bytes covered.
    pub fn len(&self) -> u64 {
        self.segments().iter().map(|s| s.len).sum()
    }

    /// Never true for a translation `translate` returned (zero-length ranges are errors).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// Checks a `(iova, len)` argument and returns its exclusive end.
fn range_end(vm: VmId, iova: Iova, len: u64) -> Result<u64, AtcError> {
    if len == 0 {
        return Err(AtcError::ZeroLength { vm, iova });
    }
    iova.0
        .checked_add(len)
        .ok_or(AtcError::IovaOverflow { vm, iova, len })
}

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
    fn intersecting(
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

/// vATC configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtcConfig {
    /// Capacity in entries (one entry per cached region); at least 1.
    pub entries_max: usize,
}

impl Default for AtcConfig {
    /// 1024 entries: a few regions per VM for a few hundred VM ports on a host.
    fn default() -> Self {
        Self { entries_max: 1024 }
    }
}

/// One cached region of one VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtcEntry {
    /// The VM whose region this is.
    pub vm: VmId,
    /// The region, as the authority had it at fill time.
    pub mapping: Mapping,
    /// The VM's epoch at fill time.
    pub epoch: AtcEpoch,
    /// Use stamp for LRU eviction (larger is more recent).
    pub used: u64,
}

spillway_vswitch::counters! {
    /// vATC counters (dotted names in [`AtcCounters::iter`]).
    #[derive(Copy, PartialEq, Eq)]
    pub struct AtcCounters {
        /// Translations served from the cache.
        hit => "atc.hit",
        /// Translations that returned [`AtcError::Miss`].
        miss => "atc.miss",
        /// Entries dropped because their epoch was no longer the VM's.
        stale => "atc.stale",
        /// Entries evicted to make room.
        evict => "atc.evict",
        /// Translations that returned [`AtcError::Permission`].
        perm_denied => "atc.perm_denied",
        /// Translations that returned [`AtcError::TooManySegments`].
        segments_exceeded => "atc.segments_exceeded",
        /// Translations refused for a zero-length or overflowing range.
        invalid => "atc.invalid",
        /// Entries inserted by fills.
        fill => "atc.fill",
        /// Entries dropped by explicit invalidation.
        invalidated => "atc.invalidated",
        /// Translations that returned [`AtcError::Unmapped`] (a known gap).
        unmapped => "atc.unmapped",
        /// Known-unmapped gaps learned by [`Atc::fill_map`].
        unmapped_fill => "atc.unmapped_fill",
    }
}

/// The bounded translation cache the spill plane keeps. See the module docs for the rules.
#[derive(Clone, Debug)]
pub struct Atc {
    config: AtcConfig,
    /// Keyed by `(vm, region start)`; a VM's entries never overlap.
    entries: BTreeMap<(VmId, Iova), AtcEntry>,
    /// The last use stamp handed out.
    used_last: u64,
    /// Key of the entry that served the last hit: a VM's receive buffers sit in one region, so
    /// the next translation usually falls in it too and is served by one lookup.
    last_hit: Option<(VmId, Iova)>,
    /// Known-unmapped gaps keyed by `(vm, start)`; a VM's gaps never overlap.
    unmapped: BTreeMap<(VmId, Iova), Gap>,
    counters: AtcCounters,
}

/// A gap in a VM's map: `[start, end)` was mapped nowhere at `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gap {
    end: u64,
    epoch: AtcEpoch,
    /// Use stamp (shared with the entries'): the oldest gap is replaced first.
    used: u64,
}

/// What walking a range over the cache found (built without allocating).
enum Walk {
    Hit(Translation),
    Miss(AtcMiss),
    Permission(IovaRange, Perm),
    TooManySegments,
}

impl Atc {
    /// An empty cache. Errors if `entries_max` is 0.
    pub fn new(config: AtcConfig) -> Result<Self, AtcError> {
        if config.entries_max == 0 {
            return Err(AtcError::InvalidConfig {
                field: "entries_max",
                value: 0,
            });
        }
        Ok(Self {
            config,
            entries: BTreeMap::new(),
            used_last: 0,
            last_hit: None,
            unmapped: BTreeMap::new(),
            counters: AtcCounters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AtcConfig {
        &self.config
    }

    /// The counters.
    pub fn counters(&self) -> &AtcCounters {
        &self.counters
    }

    /// Number of cached entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The VM's cached entries (fresh or not), in IOVA order.
    pub fn entries(&self, vm: VmId) -> impl Iterator<Item = &AtcEntry> + '_ {
        self.entries
            .range((vm, Iova(0))..=(vm, Iova(u64::MAX)))
            .map(|(_, e)| e)
    }

    /// Key of the first of `vm`'s entries that may intersect a range starting at `iova`.
    fn first_key(&self, vm: VmId, iova: Iova) -> Iova {
        self.entries
            .range(..=(vm, iova))
            .next_back()
            .filter(|((v, _), e)| *v == vm && e.mapping.iova_end() > iova.0)
            .map_or(iova, |(_, e)| e.mapping.iova)
    }

    /// Translates `[iova, iova + len)` of `vm` for access `need`, using only entries whose epoch
    /// is `table`'s current epoch for `vm` (only the epoch is read from `table`: the cache never
    /// consults the authority's regions here). See the module docs for the outcomes and their
    /// order. A hit allocates nothing; a stale entry turns the walk into a miss after every stale
    /// entry of the VM is dropped.
    pub fn translate(
        &mut self,
        table: &RegionTable,
        vm: VmId,
        iova: Iova,
        len: u64,
        need: Perm,
    ) -> Result<Translation, AtcError> {
        self.translate_at(table.epoch(vm), vm, iova, len, need)
    }

    /// [`Atc::translate`] for a cache whose authority is elsewhere (another process): `epoch`
    /// is the VM's current epoch as the authority last announced it. Entries of any other
    /// epoch are never used.
    pub fn translate_at(
        &mut self,
        epoch: AtcEpoch,
        vm: VmId,
        iova: Iova,
        len: u64,
        need: Perm,
    ) -> Result<Translation, AtcError> {
        let end = match range_end(vm, iova, len) {
            Ok(end) => end,
            Err(e) => {
                self.counters.invalid += 1;
                return Err(e);
            }
        };
        // Fast path: the range lies inside the last hit's entry, which is fresh and grants the
        // access. The walk below would find that one entry alone and the same answer.
        if let Some(key) = self.last_hit
            && key.0 == vm
            && let Some(e) = self.entries.get_mut(&key)
        {
            let m = e.mapping;
            if e.epoch == epoch && iova >= m.iova && end <= m.iova_end() && m.perm.allows(need) {
                self.used_last += 1;
                e.used = self.used_last;
                self.counters.hit += 1;
                let unused = Segment {
                    iova: Iova(0),
                    host: HostAddr(0),
                    len: 0,
                };
                let mut segments = [unused; SEGMENTS_MAX];
                segments[0] = Segment {
                    iova,
                    host: HostAddr(m.host.0 + (iova.0 - m.iova.0)),
                    len,
                };
                return Ok(Translation { segments, count: 1 });
            }
        }
        let first = self.first_key(vm, iova);
        let keys = (
            Bound::Included((vm, first)),
            Bound::Excluded((vm, Iova(end))),
        );
        if self.entries.range(keys).any(|(_, e)| e.epoch != epoch) {
            // An older epoch can never become current again, so every stale entry of this VM
            // is dead: drop them all now rather than one walk at a time.
            let before = self.entries.len();
            self.entries
                .retain(|&(v, _), e| v != vm || e.epoch == epoch);
            self.counters.stale += (before - self.entries.len()) as u64;
        }
        let range = IovaRange { start: iova, len };
        match self.walk(vm, iova, end, need) {
            Walk::Hit(t) => {
                self.counters.hit += 1;
                let first = self.first_key(vm, iova);
                if t.segments().len() == 1 {
                    // One entry served it: the one the next translation will most likely use.
                    self.last_hit = Some((vm, first));
                }
                let keys = (
                    Bound::Included((vm, first)),
                    Bound::Excluded((vm, Iova(end))),
                );
                for (_, e) in self.entries.range_mut(keys) {
                    self.used_last += 1;
                    e.used = self.used_last;
                }
                Ok(t)
            }
            Walk::Miss(m) => {
                // Only now, off the hit path: a miss that touches a known gap is final.
                if let Some(gap) = self.unmapped_gap(vm, epoch, iova, end) {
                    self.counters.unmapped += 1;
                    return Err(AtcError::Unmapped { vm, range: gap });
                }
                self.counters.miss += 1;
                Err(AtcError::Miss(m))
            }
            Walk::Permission(part, have) => {
                self.counters.perm_denied += 1;
                Err(AtcError::Permission {
                    vm,
                    range: part,
                    have,
                    need,
                })
            }
            Walk::TooManySegments => {
                self.counters.segments_exceeded += 1;
                Err(AtcError::TooManySegments {
                    vm,
                    range,
                    segments_max: SEGMENTS_MAX,
                })
            }
        }
    }

    /// Walks `[iova, end)` over `vm`'s (all fresh) entries: gaps first, then permissions, then
    /// the segment count.
    fn walk(&self, vm: VmId, iova: Iova, end: u64, need: Perm) -> Walk {
        let range = IovaRange {
            start: iova,
            len: end - iova.0,
        };
        let unused = Segment {
            iova: Iova(0),
            host: HostAddr(0),
            len: 0,
        };
        let mut segments = [unused; SEGMENTS_MAX];
        let mut segment_count = 0usize;
        let mut missing = [range; MISS_RANGES_MAX];
        let mut miss_count = 0usize;
        let mut exact = true;
        let mut denied: Option<(IovaRange, Perm)> = None;
        let mut gap = |from: u64, to: u64| {
            if miss_count < MISS_RANGES_MAX {
                missing[miss_count] = IovaRange {
                    start: Iova(from),
                    len: to - from,
                };
                miss_count += 1;
            } else {
                // Out of room: stretch the last range to the end of the asked range.
                exact = false;
                let last = &mut missing[MISS_RANGES_MAX - 1];
                last.len = end - last.start.0;
            }
        };
        let mut cursor = iova.0;
        let first = self.first_key(vm, iova);
        let keys = (
            Bound::Included((vm, first)),
            Bound::Excluded((vm, Iova(end))),
        );
        for (_, e) in self.entries.range(keys) {
            let m = &e.mapping;
            if m.iova.0 > cursor {
                gap(cursor, m.iova.0);
            }
            let from = cursor.max(m.iova.0);
            let to = end.min(m.iova_end());
            debug_assert!(from < to, "only entries intersecting the range are walked");
            if denied.is_none() && !m.perm.allows(need) {
                let part = IovaRange {
                    start: Iova(from),
                    len: to - from,
                };
                denied = Some((part, m.perm));
            }
            if segment_count < SEGMENTS_MAX {
                segments[segment_count] = Segment {
                    iova: Iova(from),
                    host: HostAddr(m.host.0 + (from - m.iova.0)),
                    len: to - from,
                };
            }
            segment_count += 1;
            cursor = to;
        }
        if cursor < end {
            gap(cursor, end);
        }
        if miss_count > 0 {
            return Walk::Miss(AtcMiss {
                vm,
                range,
                missing,
                count: miss_count as u8,
                exact,
            });
        }
        if let Some((part, have)) = denied {
            return Walk::Permission(part, have);
        }
        if segment_count > SEGMENTS_MAX {
            return Walk::TooManySegments;
        }
        Walk::Hit(Translation {
            segments,
            count: segment_count as u8,
        })
    }

    /// Miss resolution: looks `[iova, iova + len)` up in the authority and caches every region
    /// of `vm` that intersects it (whole regions, stamped with the VM's current epoch), replacing
    /// any cached entries of `vm` they overlap and evicting the least recently used entries when
    /// full. Returns how many entries it inserted (0 when nothing there is mapped).
    ///
    /// On a real ATC this is a command whose completion arrives later; the owning node emits
    /// the request and the driver calls `fill` on completion. Slow path: may allocate.
    pub fn fill(
        &mut self,
        table: &RegionTable,
        vm: VmId,
        iova: Iova,
        len: u64,
    ) -> Result<usize, AtcError> {
        let end = range_end(vm, iova, len)?;
        self.fill_from(
            vm,
            table.epoch(vm),
            table.intersecting(vm, iova, end),
            iova,
            len,
        )
    }

    /// Miss resolution with an authority elsewhere: `regions` are `vm`'s regions as the
    /// authority reported them at `epoch` (its answer to a translation request, which may list
    /// more than the asked range). Caches those that intersect `[iova, iova + len)`, as
    /// [`Atc::fill`] does; a region that is empty or overflows is refused before anything is
    /// cached.
    pub fn fill_from<'a>(
        &mut self,
        vm: VmId,
        epoch: AtcEpoch,
        regions: impl Iterator<Item = &'a Mapping> + Clone,
        iova: Iova,
        len: u64,
    ) -> Result<usize, AtcError> {
        let end = range_end(vm, iova, len)?;
        for m in regions.clone() {
            range_end(vm, m.iova, m.len)?;
            if m.host.0.checked_add(m.len).is_none() {
                return Err(AtcError::HostOverflow {
                    vm,
                    host: m.host,
                    len: m.len,
                });
            }
        }
        let mut inserted = 0;
        for m in regions.filter(|m| m.iova.0 < end && m.iova_end() > iova.0) {
            // Replace overlapping entries (an older copy of this region, or stale neighbours).
            self.drop_range(vm, m.iova, m.iova_end());
            while self.entries.len() >= self.config.entries_max {
                self.evict_one();
            }
            self.used_last += 1;
            self.entries.insert(
                (vm, m.iova),
                AtcEntry {
                    vm,
                    mapping: *m,
                    epoch,
                    used: self.used_last,
                },
            );
            inserted += 1;
        }
        self.counters.fill += inserted as u64;
        Ok(inserted)
    }

    /// [`Atc::fill_from`], where `regions` is `vm`'s *complete* map at `epoch` (the authority's
    /// whole answer, as the DPU process sends it): besides caching the regions that intersect
    /// `[iova, iova + len)`, remembers each part of that range no region covers as unmapped at
    /// `epoch`, widened to the gap between the neighbouring regions (see the module docs).
    /// Returns how many entries and how many gaps it inserted.
    ///
    /// A caller that passes only part of the map would make mapped addresses look unmapped:
    /// translations there would fail (never succeed wrongly) until the VM's epoch moves.
    pub fn fill_map<'a>(
        &mut self,
        vm: VmId,
        epoch: AtcEpoch,
        regions: impl Iterator<Item = &'a Mapping> + Clone,
        iova: Iova,
        len: u64,
    ) -> Result<(usize, usize), AtcError> {
        let inserted = self.fill_from(vm, epoch, regions.clone(), iova, len)?;
        let end = range_end(vm, iova, len)?;
        // Walk the asked range over the regions in IOVA order (a handful: sort a copy).
        let mut sorted: Vec<&Mapping> = regions.collect();
        sorted.sort_by_key(|m| m.iova);
        let mut gaps = 0;
        let mut cursor = iova.0;
        let mut below = 0u64; // end of the last region at or below the cursor
        for m in &sorted {
            if m.iova_end() <= cursor {
                below = below.max(m.iova_end());
                continue;
            }
            if cursor >= end {
                break;
            }
            if m.iova.0 > cursor {
                // [cursor, min(m.iova, end)) is uncovered; the gap runs from `below` to m.iova.
                self.learn_gap(vm, epoch, below, m.iova.0);
                gaps += 1;
            }
            cursor = cursor.max(m.iova_end());
            below = m.iova_end();
        }
        if cursor < end {
            self.learn_gap(vm, epoch, below, u64::MAX);
            gaps += 1;
        }
        Ok((inserted, gaps))
    }

    /// Remembers `[start, end)` of `vm` as unmapped at `epoch`, replacing the VM's gaps it
    /// overlaps and the oldest when full.
    fn learn_gap(&mut self, vm: VmId, epoch: AtcEpoch, start: u64, end: u64) {
        if start >= end {
            return;
        }
        self.drop_gaps(vm, start, end);
        // Gaps of older epochs are dead: drop them rather than let them take room.
        self.unmapped
            .retain(|&(v, _), g| v != vm || g.epoch == epoch);
        while self
            .unmapped
            .range((vm, Iova(0))..=(vm, Iova(u64::MAX)))
            .count()
            >= UNMAPPED_PER_VM_MAX
        {
            self.drop_oldest_gap(Some(vm));
        }
        while self.unmapped.len() >= self.config.entries_max {
            self.drop_oldest_gap(None);
        }
        self.used_last += 1;
        self.unmapped.insert(
            (vm, Iova(start)),
            Gap {
                end,
                epoch,
                used: self.used_last,
            },
        );
        self.counters.unmapped_fill += 1;
    }

    fn drop_oldest_gap(&mut self, vm: Option<VmId>) {
        let key = self
            .unmapped
            .iter()
            .filter(|((v, _), _)| vm.is_none_or(|w| w == *v))
            .min_by_key(|(k, g)| (g.used, **k))
            .map(|(k, _)| *k)
            .expect("called only when there is a gap to drop");
        self.unmapped.remove(&key);
    }

    /// Drops `vm`'s gaps intersecting `[start, end)`; returns how many.
    fn drop_gaps(&mut self, vm: VmId, start: u64, end: u64) -> usize {
        let doomed: Vec<(VmId, Iova)> = self
            .unmapped
            .range((vm, Iova(0))..(vm, Iova(end)))
            .filter(|(_, g)| g.end > start)
            .map(|(k, _)| *k)
            .collect();
        for k in &doomed {
            self.unmapped.remove(k);
        }
        doomed.len()
    }

    /// The gap of `vm` at `epoch` that `[iova, end)` touches, if any. Gaps do not overlap, so
    /// only the last one starting below `end` can.
    fn unmapped_gap(&self, vm: VmId, epoch: AtcEpoch, iova: Iova, end: u64) -> Option<IovaRange> {
        let ((_, start), g) = self
            .unmapped
            .range((vm, Iova(0))..(vm, Iova(end)))
            .next_back()?;
        (g.end > iova.0 && g.epoch == epoch).then_some(IovaRange {
            start: *start,
            len: g.end - start.0,
        })
    }

    /// Evicts the least recently used entry; ties by `(VmId, Iova)`.
    fn evict_one(&mut self) {
        let key = self
            .entries
            .iter()
            .min_by_key(|(k, e)| (e.used, **k))
            .map(|(k, _)| *k)
            .expect("evict_one is called only on a full, non-empty cache");
        self.entries.remove(&key);
        self.counters.evict += 1;
    }

    /// Drops `vm`'s entries intersecting `[iova, end)`; returns how many.
    fn drop_range(&mut self, vm: VmId, iova: Iova, end: u64) -> usize {
        let first = self.first_key(vm, iova);
        let keys = (
            Bound::Included((vm, first)),
            Bound::Excluded((vm, Iova(end))),
        );
        let doomed: Vec<(VmId, Iova)> = self.entries.range(keys).map(|(k, _)| *k).collect();
        for k in &doomed {
            self.entries.remove(k);
        }
        doomed.len()
    }

    /// Drops every entry of `vm` intersecting `[iova, iova + len)`; returns how many.
    pub fn invalidate(&mut self, vm: VmId, iova: Iova, len: u64) -> Result<usize, AtcError> {
        let end = range_end(vm, iova, len)?;
        let n = self.drop_range(vm, iova, end);
        self.drop_gaps(vm, iova.0, end);
        self.counters.invalidated += n as u64;
        Ok(n)
    }

    /// Drops every entry of `vm` (its port was torn down); returns how many.
    pub fn invalidate_vm(&mut self, vm: VmId) -> usize {
        let before = self.entries.len();
        self.entries.retain(|&(v, _), _| v != vm);
        self.unmapped.retain(|&(v, _), _| v != vm);
        let n = before - self.entries.len();
        self.counters.invalidated += n as u64;
        n
    }

    /// Drops every entry; returns how many.
    pub fn invalidate_all(&mut self) -> usize {
        let n = self.entries.len();
        self.entries.clear();
        self.unmapped.clear();
        self.counters.invalidated += n as u64;
        n
    }

    /// Checks: size within `entries_max`, keys match entries, no entry is empty or overflows,
    /// a VM's entries do not overlap, use stamps are unique and not beyond the last one.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.entries.len() > self.config.entries_max {
            return Err(format!(
                "{} entries exceed entries_max {}",
                self.entries.len(),
                self.config.entries_max
            ));
        }
        let mut prev: Option<&AtcEntry> = None;
        let mut stamps = std::collections::BTreeSet::new();
        for (&(vm, iova), e) in &self.entries {
            let m = &e.mapping;
            if e.vm != vm || m.iova != iova {
                return Err(format!("entry {e:?} keyed at ({vm:?}, {iova:?})"));
            }
            if m.len == 0
                || iova.0.checked_add(m.len).is_none()
                || m.host.0.checked_add(m.len).is_none()
            {
                return Err(format!("entry {e:?} is empty or overflows"));
            }
            if let Some(p) = prev
                && p.vm == vm
                && p.mapping.iova_end() > iova.0
            {
                return Err(format!("entries {p:?} and {e:?} overlap"));
            }
            if e.used == 0 || e.used > self.used_last || !stamps.insert(e.used) {
                return Err(format!("entry {e:?} has a bad use stamp"));
            }
            prev = Some(e);
        }
        if self.unmapped.len() > self.config.entries_max {
            return Err(format!("{} gaps exceed entries_max", self.unmapped.len()));
        }
        let mut prev: Option<(VmId, u64)> = None;
        let mut per_vm = 0usize;
        for (&(vm, start), g) in &self.unmapped {
            if g.end <= start.0 {
                return Err(format!("gap ({vm:?}, {start:?}) is empty"));
            }
            per_vm = if prev.is_some_and(|(v, _)| v == vm) {
                per_vm + 1
            } else {
                1
            };
            if per_vm > UNMAPPED_PER_VM_MAX {
                return Err(format!("{vm:?} has more than {UNMAPPED_PER_VM_MAX} gaps"));
            }
            if prev.is_some_and(|(v, e)| v == vm && e > start.0) {
                return Err(format!("gaps of {vm:?} overlap at {start:?}"));
            }
            prev = Some((vm, g.end));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM: VmId = VmId(1);

    fn region(iova: u64, len: u64, host: u64, perm: Perm) -> Mapping {
        Mapping {
            iova: Iova(iova),
            len,
            host: HostAddr(host),
            perm,
        }
    }

    fn miss(r: Result<Translation, AtcError>) -> AtcMiss {
        match r {
            Err(AtcError::Miss(m)) => m,
            other => panic!("expected a miss, got {other:?}"),
        }
    }

    fn rng(start: u64, len: u64) -> IovaRange {
        IovaRange {
            start: Iova(start),
            len,
        }
    }

    #[test]
    fn map_rejects_overlap_naming_both_ranges() {
        let mut t = RegionTable::new();
        t.map(VM, region(0x100, 0x100, 0, Perm::RW)).unwrap();
        let err = t
            .map(VM, region(0x180, 0x100, 0x1000, Perm::RW))
            .unwrap_err();
        assert_eq!(
            err,
            AtcError::Overlap {
                vm: VM,
                new: rng(0x180, 0x100),
                existing: rng(0x100, 0x100)
            }
        );
        // Another VM may use the same IOVAs; adjacency is not overlap.
        t.map(VmId(2), region(0x180, 0x100, 0x1000, Perm::RW))
            .unwrap();
        t.map(VM, region(0x200, 0x100, 0x1000, Perm::RW)).unwrap();
        t.check_invariants().unwrap();
    }

    #[test]
    fn zero_length_and_overflow_are_errors() {
        let mut t = RegionTable::new();
        assert_eq!(
            t.map(VM, region(5, 0, 0, Perm::RW)),
            Err(AtcError::ZeroLength {
                vm: VM,
                iova: Iova(5)
            })
        );
        assert_eq!(
            t.map(VM, region(u64::MAX, 1, 0, Perm::RW)),
            Err(AtcError::IovaOverflow {
                vm: VM,
                iova: Iova(u64::MAX),
                len: 1
            })
        );
        assert_eq!(
            t.map(VM, region(0, 2, u64::MAX - 1, Perm::RW)),
            Err(AtcError::HostOverflow {
                vm: VM,
                host: HostAddr(u64::MAX - 1),
                len: 2
            })
        );
        assert_eq!(t.epoch(VM), AtcEpoch(0), "failed maps change nothing");
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        assert!(matches!(
            atc.translate(&t, VM, Iova(1), 0, Perm::WRITE),
            Err(AtcError::ZeroLength { .. })
        ));
        assert!(matches!(
            atc.translate(&t, VM, Iova(u64::MAX - 1), 2, Perm::WRITE),
            Err(AtcError::IovaOverflow { .. })
        ));
        assert_eq!(atc.counters().invalid, 2);
        assert!(atc.fill(&t, VM, Iova(0), 0).is_err());
        assert!(atc.invalidate(VM, Iova(0), 0).is_err());
        assert!(matches!(
            Atc::new(AtcConfig { entries_max: 0 }),
            Err(AtcError::InvalidConfig { .. })
        ));
    }

    #[test]
    fn translate_spans_regions_and_reports_exact_gaps() {
        let mut t = RegionTable::new();
        t.map(VM, region(0, 10, 100, Perm::RW)).unwrap();
        t.map(VM, region(10, 10, 500, Perm::RW)).unwrap();
        t.map(VM, region(30, 10, 900, Perm::RW)).unwrap();
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        atc.fill(&t, VM, Iova(12), 1).unwrap();
        let m = miss(atc.translate(&t, VM, Iova(5), 30, Perm::WRITE));
        assert_eq!(m.missing(), &[rng(5, 5), rng(20, 15)]);
        assert!(m.exact());
        for r in m.missing() {
            atc.fill(&t, VM, r.start, r.len).unwrap();
        }
        // [20, 30) is unmapped in the authority: it still misses, and only it.
        let m = miss(atc.translate(&t, VM, Iova(5), 30, Perm::WRITE));
        assert_eq!(m.missing(), &[rng(20, 10)]);
        let tr = atc.translate(&t, VM, Iova(5), 10, Perm::WRITE).unwrap();
        assert_eq!(
            tr.segments(),
            &[
                Segment {
                    iova: Iova(5),
                    host: HostAddr(105),
                    len: 5
                },
                Segment {
                    iova: Iova(10),
                    host: HostAddr(500),
                    len: 5
                },
            ]
        );
        assert_eq!(tr.len(), 10);
        assert_eq!(atc.counters().hit, 1);
        assert_eq!(atc.counters().miss, 2);
        atc.check_invariants().unwrap();
    }

    #[test]
    fn more_gaps_than_reported_stretch_the_last_range() {
        let mut t = RegionTable::new();
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        for i in 0..5 {
            t.map(VM, region(i * 10 + 5, 5, 0, Perm::RW)).unwrap();
        }
        atc.fill(&t, VM, Iova(0), 100).unwrap();
        let m = miss(atc.translate(&t, VM, Iova(0), 60, Perm::WRITE));
        assert!(!m.exact());
        assert_eq!(
            m.missing(),
            &[rng(0, 5), rng(10, 5), rng(20, 5), rng(30, 30)]
        );
    }

    #[test]
    fn permission_denial_is_not_a_miss() {
        let mut t = RegionTable::new();
        t.map(VM, region(0, 10, 0, Perm::RW)).unwrap();
        t.map(VM, region(10, 10, 10, Perm::READ)).unwrap();
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        atc.fill(&t, VM, Iova(0), 20).unwrap();
        assert_eq!(
            atc.translate(&t, VM, Iova(5), 10, Perm::WRITE),
            Err(AtcError::Permission {
                vm: VM,
                range: rng(10, 5),
                have: Perm::READ,
                need: Perm::WRITE
            })
        );
        assert!(atc.translate(&t, VM, Iova(5), 10, Perm::READ).is_ok());
        assert_eq!(atc.counters().perm_denied, 1);
        assert_eq!(atc.counters().miss, 0);
    }

    #[test]
    fn too_many_segments_is_reported() {
        let mut t = RegionTable::new();
        for i in 0..5 {
            t.map(VM, region(i * 4, 4, i * 100, Perm::RW)).unwrap();
        }
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        atc.fill(&t, VM, Iova(0), 20).unwrap();
        assert!(atc.translate(&t, VM, Iova(0), 16, Perm::WRITE).is_ok());
        assert!(matches!(
            atc.translate(&t, VM, Iova(0), 17, Perm::WRITE),
            Err(AtcError::TooManySegments {
                segments_max: 4,
                ..
            })
        ));
    }

    #[test]
    fn cache_evicts_least_recently_used_when_full() {
        let mut t = RegionTable::new();
        for i in 0..4 {
            t.map(VM, region(i * 10, 10, i * 10, Perm::RW)).unwrap();
        }
        let mut atc = Atc::new(AtcConfig { entries_max: 3 }).unwrap();
        for i in 0..3 {
            atc.fill(&t, VM, Iova(i * 10), 1).unwrap();
        }
        // Touch region 0 so region 10 is the least recently used.
        atc.translate(&t, VM, Iova(0), 1, Perm::WRITE).unwrap();
        atc.fill(&t, VM, Iova(30), 1).unwrap();
        assert_eq!(atc.len(), 3);
        assert_eq!(atc.counters().evict, 1);
        let starts: Vec<u64> = atc.entries(VM).map(|e| e.mapping.iova.0).collect();
        assert_eq!(starts, [0, 20, 30]);
        atc.check_invariants().unwrap();
    }

    #[test]
    fn stale_entries_are_never_used_even_without_invalidation() {
        let mut t = RegionTable::new();
        t.map(VM, region(0, 10, 100, Perm::RW)).unwrap();
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        atc.fill(&t, VM, Iova(0), 10).unwrap();
        t.unmap(VM, Iova(0), 10).unwrap();
        t.map(VM, region(0, 10, 700, Perm::RW)).unwrap();
        let m = miss(atc.translate(&t, VM, Iova(0), 10, Perm::WRITE));
        assert_eq!(m.missing(), &[rng(0, 10)]);
        assert_eq!(atc.counters().stale, 1);
        atc.fill(&t, VM, Iova(0), 10).unwrap();
        let tr = atc.translate(&t, VM, Iova(0), 10, Perm::WRITE).unwrap();
        assert_eq!(tr.segments()[0].host, HostAddr(700));
        // A VM removed and re-added never revives its old entries.
        t.remove_vm(VM);
        t.map(VM, region(0, 10, 700, Perm::RW)).unwrap();
        assert!(matches!(
            atc.translate(&t, VM, Iova(0), 10, Perm::WRITE),
            Err(AtcError::Miss(_))
        ));
    }

    #[test]
    fn invalidation_drops_only_what_it_names() {
        let mut t = RegionTable::new();
        let other = VmId(2);
        for vm in [VM, other] {
            t.map(vm, region(0, 10, 0, Perm::RW)).unwrap();
            t.map(vm, region(10, 10, 10, Perm::RW)).unwrap();
        }
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        atc.fill(&t, VM, Iova(0), 20).unwrap();
        atc.fill(&t, other, Iova(0), 20).unwrap();
        assert_eq!(atc.invalidate(VM, Iova(9), 1).unwrap(), 1);
        assert!(atc.translate(&t, VM, Iova(10), 10, Perm::WRITE).is_ok());
        assert!(atc.translate(&t, VM, Iova(0), 10, Perm::WRITE).is_err());
        assert_eq!(atc.invalidate_vm(other), 2);
        assert_eq!(atc.invalidate_all(), 1);
        assert!(atc.is_empty());
        assert_eq!(atc.counters().invalidated, 4);
    }

    #[test]
    fn unmap_removes_whole_intersecting_regions() {
        let mut t = RegionTable::new();
        t.map(VM, region(0, 10, 0, Perm::RW)).unwrap();
        t.map(VM, region(10, 10, 10, Perm::RW)).unwrap();
        t.map(VM, region(30, 10, 30, Perm::RW)).unwrap();
        let e = t.epoch(VM);
        assert_eq!(t.unmap(VM, Iova(20), 10).unwrap(), []);
        assert_eq!(t.epoch(VM), e, "a no-op unmap keeps the epoch");
        let gone = t.unmap(VM, Iova(5), 10).unwrap();
        assert_eq!(gone.len(), 2);
        assert!(t.epoch(VM) > e);
        assert_eq!(t.regions(VM).count(), 1);
        assert_eq!(t.remove_vm(VM).len(), 1);
        t.check_invariants().unwrap();
    }

    #[test]
    fn an_address_outside_every_region_costs_one_fill_per_gap_and_epoch() {
        let vm = VmId(3);
        let mut t = RegionTable::new();
        t.map(vm, region(0x1000, 0x1000, 0x10_000, Perm::WRITE))
            .unwrap();
        t.map(vm, region(0x4000, 0x1000, 0x20_000, Perm::WRITE))
            .unwrap();
        let mut atc = Atc::new(AtcConfig { entries_max: 16 }).unwrap();
        let epoch = t.epoch(vm);
        let mut requests = 0;
        // 1,000 packets to a buffer between the regions, then 1,000 beyond the last one.
        for addr in [0x2800u64, 0x9000] {
            for _ in 0..1000 {
                match atc.translate_at(epoch, vm, Iova(addr), 64, Perm::WRITE) {
                    Err(AtcError::Miss(m)) => {
                        requests += 1;
                        for r in m.missing() {
                            atc.fill_map(vm, epoch, t.regions(vm), r.start, r.len)
                                .unwrap();
                        }
                    }
                    Err(AtcError::Unmapped { .. }) => {}
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(requests, 2, "one per gap");
        assert_eq!(atc.counters().unmapped, 1998);
        // The gap is the whole space between the neighbours: another address in it is known.
        assert_eq!(
            atc.translate_at(epoch, vm, Iova(0x3f00), 0x100, Perm::WRITE),
            Err(AtcError::Unmapped {
                vm,
                range: rng(0x2000, 0x2000)
            })
        );
        // Mapped addresses still translate; a range straddling a region and a gap is refused.
        atc.fill_map(vm, epoch, t.regions(vm), Iova(0x1000), 0x1000)
            .unwrap();
        assert!(
            atc.translate_at(epoch, vm, Iova(0x1000), 64, Perm::WRITE)
                .is_ok()
        );
        assert!(matches!(
            atc.translate_at(epoch, vm, Iova(0x1fc0), 0x80, Perm::WRITE),
            Err(AtcError::Unmapped { .. })
        ));
        atc.check_invariants().unwrap();
        // The VM's map changes: the gap is dead at the new epoch and asked about again.
        t.map(vm, region(0x2000, 0x1000, 0x30_000, Perm::WRITE))
            .unwrap();
        let epoch = t.epoch(vm);
        let m = miss(atc.translate_at(epoch, vm, Iova(0x2800), 64, Perm::WRITE));
        atc.fill_map(vm, epoch, t.regions(vm), m.range.start, m.range.len)
            .unwrap();
        assert!(
            atc.translate_at(epoch, vm, Iova(0x2800), 64, Perm::WRITE)
                .is_ok()
        );
        // Invalidating the VM forgets its gaps too.
        let m = miss(atc.translate_at(epoch, vm, Iova(0x9000), 64, Perm::WRITE));
        atc.fill_map(vm, epoch, t.regions(vm), m.range.start, m.range.len)
            .unwrap();
        atc.invalidate_vm(vm);
        assert!(matches!(
            atc.translate_at(epoch, vm, Iova(0x9000), 64, Perm::WRITE),
            Err(AtcError::Miss(_))
        ));
    }

    #[test]
    fn gaps_are_bounded_per_vm_and_in_all() {
        let mut atc = Atc::new(AtcConfig { entries_max: 12 }).unwrap();
        let mut t = RegionTable::new();
        for v in 0..3u32 {
            let vm = VmId(v);
            // 20 regions with gaps between them: more gaps than a VM may keep.
            for k in 0..20u64 {
                t.map(
                    vm,
                    region(0x10_000 * (k + 1), 0x1000, 0x1000 * k, Perm::WRITE),
                )
                .unwrap();
            }
            for k in 0..20u64 {
                let addr = 0x10_000 * (k + 1) + 0x8000;
                atc.fill_map(vm, t.epoch(vm), t.regions(vm), Iova(addr), 64)
                    .unwrap();
                atc.check_invariants().unwrap();
            }
        }
        assert_eq!(atc.counters().unmapped_fill, 60);
    }

    #[test]
    fn counters_have_dotted_names() {
        let atc = Atc::new(AtcConfig::default()).unwrap();
        let names: Vec<&str> = atc.counters().iter().map(|(n, _)| n).collect();
        assert!(names.contains(&"atc.hit") && names.contains(&"atc.perm_denied"));
        assert!(names.iter().all(|n| n.starts_with("atc.")));
    }
}
