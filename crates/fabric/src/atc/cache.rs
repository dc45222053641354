//! The cache: the bounded, epoch-checked copy of authority regions the spill plane translates
//! through, with its negative entries for known-unmapped gaps, LRU eviction, invalidation and
//! counters. The rules are in the parent module's documentation.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::{
    AtcEpoch, AtcError, AtcMiss, HostAddr, Iova, IovaRange, MISS_RANGES_MAX, Mapping, Perm,
    RegionTable, SEGMENTS_MAX, Segment, Translation, UNMAPPED_PER_VM_MAX, VmId, range_end,
};

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
