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
//!
//! ## Layout
//!
//! This file holds the types both halves share (addresses, mappings, permissions, translations,
//! errors and limits). [`RegionTable`] lives in `regions.rs` and [`Atc`] with its configuration
//! and counters in `cache.rs`; both are re-exported here, so every path stays
//! `spillway_fabric::atc::...`.

mod cache;
mod regions;
#[cfg(test)]
mod tests;

pub use cache::{Atc, AtcConfig, AtcCounters, AtcEntry};
pub use regions::RegionTable;

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
