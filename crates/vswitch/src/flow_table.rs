//! The bounded exact-match flow table: the fast path's lookup structure.
//!
//! One generic type, [`FlowTable<K, V>`], models the DPU hardware table (about a million entries)
//! and the software flow caches of the spill plane. Everything it will ever need is allocated in
//! [`FlowTable::new`]; insert, lookup, remove, evict and expire never allocate.
//!
//! # The tiers (why the layout is what it is)
//!
//! A lookup of a random key in a table of a million entries misses every cache: the table is tens
//! of megabytes, so each dependent memory access costs a DRAM round trip (~80-100 ns). A naive
//! chained hash map needs two or three dependent accesses per lookup, which alone blows the
//! 50 ns budget for a whole fast-path packet. The layout therefore has exactly two tiers, each one
//! cache line, and the batch API overlaps the DRAM latency of many packets:
//!
//! 1. **Bucket array** (`Vec<Bucket>`, 64-byte aligned). A bucket is one cache line holding eight
//!    `(tag: u16, slot: u32)` pairs and an `overflow` count. The key's 64-bit hash picks the home
//!    bucket with its low bits and the tag with its top 16 bits. Tags filter out all but about one
//!    in 65,536 non-matching occupants, so a lookup touches one entry in the common case. The
//!    array is sized so buckets are at most about 3/4 full, so an insert almost always lands in its
//!    home bucket. When a bucket is full, the insert probes the next bucket (linear probing over
//!    whole cache lines) and increments the skipped bucket's `overflow`. A lookup stops at the
//!    first bucket whose `overflow` is zero. Removal decrements the counts it incremented, so
//!    there are no tombstones and lookups do not degrade under churn.
//! 2. **Entry slab** (`Vec<Option<Entry<K, V>>>`, one slot per unit of capacity). An entry starts
//!    with the key, then its hash and counters (`repr(C)`), so the key comparison and the counter
//!    update touch the first one or two cache lines of the entry (the 56-byte `FlowMatch` key plus
//!    the packet counter fill the first line). Slot indices ([`EntryIdx`]) are stable for the life of
//!    an entry, so callers (the pipeline, the DPU model's install commands) can name entries
//!    without re-hashing.
//!
//! [`FlowTable::lookup_batch`] uses group prefetching over groups of [`LOOKUP_GROUP`] keys: all
//! home buckets of a group are prefetched, then all buckets are scanned and every candidate
//! entry's lines prefetched, then all keys are confirmed and counted. A group pays about two DRAM
//! round trips in all instead of two per key; with 300-540 ns per round trip on the shared test
//! VM, a fixed-distance software pipeline (16 keys of ~5 ns work each) could not hide them.
//! [`FlowTable::prefetch`] lets the slow path warm the bucket of an entry it is about to insert.
//!
//! # Expiry and eviction
//!
//! An entry is *idle* when it is evictable and `now - last_seen >= idle_timeout`. Pinned entries
//! (`evictable == false`, e.g. redirect rules) are never idle and never evicted. A lookup of an
//! idle entry is a miss; the entry stays in place (so its value is not dropped unseen) until
//! [`FlowTable::expire`] hands it to the caller, an insert of the same key replaces it, or eviction
//! picks it (idle entries are the least valuable of all). `expire` does bounded work per call: it
//! examines at most `budget` slots, resuming from a cursor.
//!
//! When the table is full and the policy is [`FullPolicy::EvictLeastValuable`], the victim is the
//! least valuable evictable entry among the next `evict_sample` slots from an eviction cursor
//! (slot order, deterministic). Value is ordered by `(not idle, metric, key)` where the metric is
//! `last_seen` ([`EvictBy::LeastRecentlyUsed`]) or `packets` ([`EvictBy::FewestPackets`]); ties
//! break by key order. With `evict_sample >= capacity` the victim is the exact global minimum.
//! If the sample holds no evictable entry, the insert fails with [`TableFull`].

use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use foldhash::fast::FixedState;

use crate::time::Instant;

/// Keys per group of [`FlowTable::lookup_batch`]: all buckets of a group are prefetched before the
/// first is scanned, and all entries before the first is compared. On this VM one DRAM round trip
/// costs 300-540 ns, far longer than a software pipeline with a distance of 16 keys (~80 ns of
/// work) could hide; a group of 32 overlaps 32 round trips per stage. (Replaced the fixed-distance
/// pipeline, `PREFETCH_DISTANCE = 16`, which measured 270-320 ns per fast-path packet at 1M flows.)
pub const LOOKUP_GROUP: usize = 32;

/// Cache lines of an entry slot prefetched by [`FlowTable::lookup_batch`]: all of them, capped at
/// eight (512 bytes) so one lookup batch cannot flood the core's miss buffers.
const SLOT_LINES_MAX: usize = 8;

/// Pairs per bucket: eight `(u16, u32)` pairs plus the overflow count fill one cache line.
const BUCKET_WAYS: usize = 8;
/// Marks an unused pair in a bucket.
const EMPTY: u32 = u32::MAX;
/// Buckets are sized for this many occupied pairs per bucket on average (6 of 8 = 75% load).
const BUCKET_TARGET_FILL: usize = 6;

/// What to do when an insert finds the table full.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FullPolicy {
    /// Evict the least valuable evictable entry of a sample (see the module doc).
    EvictLeastValuable,
    /// Refuse the insert with [`TableFull`] (the DPU hardware table behaves like this).
    Reject,
}

/// How the value of an entry is measured for eviction. Lower value is evicted first.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EvictBy {
    /// The entry with the oldest `last_seen` is the least valuable.
    LeastRecentlyUsed,
    /// The entry with the fewest packets is the least valuable.
    FewestPackets,
}

/// Configuration of a [`FlowTable`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FlowTableConfig {
    /// Maximum number of entries, `1..=u32::MAX - 1`.
    pub capacity: usize,
    /// An evictable entry not hit for this long is idle (expired).
    pub idle_timeout: Duration,
    /// What happens at capacity.
    pub full: FullPolicy,
    /// How eviction measures value.
    pub evict: EvictBy,
    /// Candidates examined per eviction, at least 1. `>= capacity` makes eviction exact.
    pub evict_sample: usize,
    /// Seed of the key hash (foldhash `FixedState`), so runs are reproducible.
    pub hash_seed: u64,
}

impl Default for FlowTableConfig {
    fn default() -> Self {
        FlowTableConfig {
            capacity: 1 << 16,
            idle_timeout: Duration::from_secs(30),
            full: FullPolicy::EvictLeastValuable,
            evict: EvictBy::LeastRecentlyUsed,
            evict_sample: 8,
            hash_seed: 0x5eed_f10e_7ab1_e000,
        }
    }
}

/// A configuration [`FlowTable::new`] refuses.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum FlowTableConfigError {
    /// Capacity outside `1..=u32::MAX - 1`.
    #[error("flow table capacity {actual} outside 1..={max}")]
    Capacity {
        /// The configured capacity.
        actual: usize,
        /// The largest supported capacity.
        max: usize,
    },
    /// `evict_sample` is zero.
    #[error("flow table evict_sample must be at least 1")]
    EvictSampleZero,
}

/// The insert could not find room: the table is full and the policy is [`FullPolicy::Reject`],
/// or no evictable entry was found in the eviction sample. Counted in
/// [`FlowTableCounters::rejected_full`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("flow table full ({capacity} entries)")]
pub struct TableFull {
    /// The table's capacity.
    pub capacity: usize,
}

/// How an insert succeeded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Inserted<K> {
    /// The key was new and there was room.
    Fresh,
    /// The key was present (possibly idle); its value and metadata were replaced.
    Replaced,
    /// The key was new, the table was full and `victim` was evicted to make room.
    Evicted {
        /// The evicted key.
        victim: K,
    },
}

/// Stable index of an entry's slot; valid until that entry is removed, evicted or expired.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EntryIdx(pub u32);

/// Event counters of a table. Every lookup is exactly one hit or one miss.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct FlowTableCounters {
    /// Lookups that found a live entry.
    pub hits: u64,
    /// Lookups that found nothing or an idle entry.
    pub misses: u64,
    /// Successful inserts (fresh, replaced or evicting).
    pub inserts: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Inserts refused with [`TableFull`].
    pub rejected_full: u64,
    /// Entries removed by [`FlowTable::expire`].
    pub expired: u64,
}

/// One flow entry: key first, then hash and counters, then the value.
#[repr(C)]
#[derive(Clone, Debug)]
pub struct Entry<K, V> {
    key: K,
    packets: u64,
    bytes: u64,
    last_seen: Instant,
    hash: u64,
    first_seen: Instant,
    evictable: bool,
    value: V,
}

impl<K, V> Entry<K, V> {
    /// A new entry with zero counters, first and last seen `now`.
    fn fresh(now: Instant, key: K, hash: u64, value: V, evictable: bool) -> Entry<K, V> {
        Entry {
            key,
            packets: 0,
            bytes: 0,
            last_seen: now,
            hash,
            first_seen: now,
            evictable,
            value,
        }
    }

    /// The entry's key.
    pub fn key(&self) -> &K {
        &self.key
    }
    /// Packets counted by lookups since the entry was (re)inserted.
    pub fn packets(&self) -> u64 {
        self.packets
    }
    /// Bytes counted by lookups since the entry was (re)inserted.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// When the entry was (re)inserted.
    pub fn first_seen(&self) -> Instant {
        self.first_seen
    }
    /// The last hit, or the insert time if never hit.
    pub fn last_seen(&self) -> Instant {
        self.last_seen
    }
    /// Whether eviction and idle expiry may remove the entry.
    pub fn evictable(&self) -> bool {
        self.evictable
    }
    /// The entry's value.
    pub fn value(&self) -> &V {
        &self.value
    }
}

#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tags: [u16; BUCKET_WAYS],
    slots: [u32; BUCKET_WAYS],
    /// Entries whose probe sequence passed through this bucket (it was full when they were
    /// inserted) and that live in a later bucket. Zero means a lookup can stop here.
    overflow: u32,
}

/// A slab slot, cache-line aligned so the key and the packet counter share the first line.
#[repr(C, align(64))]
#[derive(Clone, Debug)]
struct Slot<K, V>(Option<Entry<K, V>>);

const EMPTY_BUCKET: Bucket = Bucket {
    tags: [0; BUCKET_WAYS],
    slots: [EMPTY; BUCKET_WAYS],
    overflow: 0,
};

/// The bounded exact-match flow table. See the module doc for layout, expiry and eviction.
#[derive(Debug)]
pub struct FlowTable<K, V> {
    buckets: Vec<Bucket>,
    bucket_mask: usize,
    entries: Vec<Slot<K, V>>,
    /// Free slots; popped from the end. Preallocated to capacity, so pushes never allocate.
    free: Vec<u32>,
    hasher: FixedState,
    idle_timeout_ns: u64,
    config: FlowTableConfig,
    evict_cursor: usize,
    expire_cursor: usize,
    counters: FlowTableCounters,
}

/// Hint the CPU to pull the cache line at `ptr` into all cache levels.
#[inline(always)]
fn prefetch<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    // SAFETY: `_mm_prefetch` is a hint that never faults or reads memory architecturally, and
    // SSE is part of the x86_64 baseline. Callers only pass addresses inside live allocations.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

impl<K, V> FlowTable<K, V>
where
    K: Copy + Eq + Hash + Ord,
{
    /// Lines of one slot prefetched per candidate (see [`SLOT_LINES_MAX`]).
    const SLOT_PREFETCH_LINES: usize = {
        let lines = core::mem::size_of::<Slot<K, V>>().div_ceil(64);
        if lines < SLOT_LINES_MAX {
            lines
        } else {
            SLOT_LINES_MAX
        }
    };

    /// Builds an empty table and allocates all its memory.
    pub fn new(config: FlowTableConfig) -> Result<Self, FlowTableConfigError> {
        let max = (u32::MAX - 1) as usize;
        if config.capacity == 0 || config.capacity > max {
            return Err(FlowTableConfigError::Capacity {
                actual: config.capacity,
                max,
            });
        }
        if config.evict_sample == 0 {
            return Err(FlowTableConfigError::EvictSampleZero);
        }
        let n_buckets = config
            .capacity
            .div_ceil(BUCKET_TARGET_FILL)
            .next_power_of_two();
        let mut entries = Vec::with_capacity(config.capacity);
        entries.resize_with(config.capacity, || Slot(None));
        // Reverse order so slots are handed out 0, 1, 2, ... (dense, cache friendly when small).
        let free: Vec<u32> = (0..config.capacity as u32).rev().collect();
        Ok(FlowTable {
            buckets: vec![EMPTY_BUCKET; n_buckets],
            bucket_mask: n_buckets - 1,
            entries,
            free,
            hasher: FixedState::with_seed(config.hash_seed),
            idle_timeout_ns: u64::try_from(config.idle_timeout.as_nanos()).unwrap_or(u64::MAX),
            config,
            evict_cursor: 0,
            expire_cursor: 0,
            counters: FlowTableCounters::default(),
        })
    }

    /// The table's configuration.
    pub fn config(&self) -> &FlowTableConfig {
        &self.config
    }

    /// Number of entries, idle ones included.
    pub fn len(&self) -> usize {
        self.config.capacity - self.free.len()
    }

    /// Whether the table holds no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Maximum number of entries.
    pub fn capacity(&self) -> usize {
        self.config.capacity
    }

    /// Event counters.
    pub fn counters(&self) -> FlowTableCounters {
        self.counters
    }

    /// Hint that `key` is about to be inserted or looked up: prefetch its home bucket. Lets a
    /// caller overlap the DRAM latency of several upcoming inserts (the slow path installs a
    /// reverse entry whose bucket no lookup has touched yet).
    #[inline]
    pub fn prefetch(&self, key: &K) {
        prefetch(&self.buckets[self.home(self.hash(key))]);
    }

    /// The seeded hash of `key`. Compute it once per packet and pass it to the `*_hashed` calls.
    #[inline]
    pub fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        (hash as usize) & self.bucket_mask
    }

    #[inline]
    fn tag(hash: u64) -> u16 {
        (hash >> 48) as u16
    }

    #[inline]
    fn is_idle(&self, e: &Entry<K, V>, now: Instant) -> bool {
        e.evictable && now.0.saturating_sub(e.last_seen.0) >= self.idle_timeout_ns
    }

    /// Slot of `key`, idle or not.
    #[inline]
    fn find(&self, hash: u64, key: &K) -> Option<u32> {
        let tag = Self::tag(hash);
        let mut b = self.home(hash);
        // Bounded by the bucket count: overflow counts are only non-zero on a probe path that
        // ends at an occupied pair, so the walk ends within the table.
        for _ in 0..self.buckets.len() {
            let bucket = &self.buckets[b];
            for i in 0..BUCKET_WAYS {
                let slot = bucket.slots[i];
                if slot != EMPTY
                    && bucket.tags[i] == tag
                    && self.entries[slot as usize]
                        .0
                        .as_ref()
                        .is_some_and(|e| e.key == *key)
                {
                    return Some(slot);
                }
            }
            if bucket.overflow == 0 {
                return None;
            }
            b = (b + 1) & self.bucket_mask;
        }
        None
    }

    /// Read-only view of `key`'s entry, idle or not; does not count as a lookup.
    pub fn get(&self, key: &K) -> Option<(EntryIdx, &Entry<K, V>)> {
        let slot = self.find(self.hash(key), key)?;
        Some((EntryIdx(slot), self.entry(EntryIdx(slot))))
    }

    /// Mutable access to `key`'s value, idle or not; does not count as a lookup.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let slot = self.find(self.hash(key), key)?;
        self.entries[slot as usize].0.as_mut().map(|e| &mut e.value)
    }

    /// The entry at `idx`. Panics if `idx` does not name a live entry (a caller bug).
    pub fn entry(&self, idx: EntryIdx) -> &Entry<K, V> {
        self.entries[idx.0 as usize]
            .0
            .as_ref()
            .expect("EntryIdx names a live entry: callers drop indices when entries go")
    }

    /// The value at `idx`. Panics like [`FlowTable::entry`].
    pub fn value(&self, idx: EntryIdx) -> &V {
        &self.entry(idx).value
    }

    /// The value in slot `idx` if the slot is occupied (by whichever entry holds it now), for
    /// callers keeping an index that may have outlived its entry.
    pub fn try_value_mut(&mut self, idx: EntryIdx) -> Option<&mut V> {
        self.entries
            .get_mut(idx.0 as usize)?
            .0
            .as_mut()
            .map(|e| &mut e.value)
    }

    /// Mutable value at `idx`. Panics like [`FlowTable::entry`].
    pub fn value_mut(&mut self, idx: EntryIdx) -> &mut V {
        &mut self.entries[idx.0 as usize]
            .0
            .as_mut()
            .expect("EntryIdx names a live entry: callers drop indices when entries go")
            .value
    }

    /// Fast-path lookup of one packet: on a hit counts the packet and `bytes` and refreshes
    /// `last_seen`. An idle entry is a miss.
    #[inline]
    pub fn lookup(&mut self, now: Instant, key: &K, bytes: u32) -> Option<EntryIdx> {
        let hash = self.hash(key);
        self.lookup_hashed(now, hash, key, bytes)
    }

    /// [`FlowTable::lookup`] with a hash from [`FlowTable::hash`].
    #[inline]
    pub fn lookup_hashed(
        &mut self,
        now: Instant,
        hash: u64,
        key: &K,
        bytes: u32,
    ) -> Option<EntryIdx> {
        let found = self.find(hash, key);
        self.account(now, found, bytes)
    }

    /// A train of `packets` packets of one flow arriving together (`bytes` in all), as the
    /// simulator's fluid traffic model offers them: same effect on the entry and the counters
    /// as `packets` single lookups at `now` (every one a hit, or every one a miss).
    pub fn lookup_train(
        &mut self,
        now: Instant,
        key: &K,
        packets: u32,
        bytes: u64,
    ) -> Option<EntryIdx> {
        let found = self.find(self.hash(key), key);
        self.account_n(now, found, packets, bytes)
    }

    #[inline]
    fn account(&mut self, now: Instant, found: Option<u32>, bytes: u32) -> Option<EntryIdx> {
        self.account_n(now, found, 1, u64::from(bytes))
    }

    /// Counts `packets` lookups of one key (one hit or miss each); a hit also counts `bytes` and
    /// refreshes `last_seen`. An idle entry is a miss.
    #[inline]
    fn account_n(
        &mut self,
        now: Instant,
        found: Option<u32>,
        packets: u32,
        bytes: u64,
    ) -> Option<EntryIdx> {
        if let Some(slot) = found {
            let idle_timeout_ns = self.idle_timeout_ns;
            let e = self.entries[slot as usize]
                .0
                .as_mut()
                .expect("find returns occupied slots");
            if !(e.evictable && now.0.saturating_sub(e.last_seen.0) >= idle_timeout_ns) {
                e.packets += u64::from(packets);
                e.bytes += bytes;
                e.last_seen = e.last_seen.max(now);
                self.counters.hits += u64::from(packets);
                return Some(EntryIdx(slot));
            }
        }
        self.counters.misses += u64::from(packets);
        None
    }

    /// Looks up a batch of packets, `keys[i]` carrying `bytes[i]`, writing each result to
    /// `out[i]`; same semantics and counter effects as calling [`FlowTable::lookup`] for each key
    /// in order. Any batch length works; nothing allocates.
    ///
    /// Group prefetching over groups of [`LOOKUP_GROUP`] keys: hash every key of the group and
    /// prefetch its home bucket; then scan every (by now arriving) bucket for a tag match and
    /// prefetch that entry's lines; then confirm every key against its entry and update its
    /// counters. A group pays about two DRAM round trips in all rather than two per key. Stage 3
    /// only touches entry counters, never buckets or slots, so a candidate found in stage 2 is
    /// still valid in stage 3.
    ///
    /// Panics if the three slices differ in length.
    pub fn lookup_batch(
        &mut self,
        now: Instant,
        keys: &[K],
        bytes: &[u32],
        out: &mut [Option<EntryIdx>],
    ) {
        assert_eq!(keys.len(), bytes.len(), "one byte count per key");
        assert_eq!(keys.len(), out.len(), "one output per key");
        let mut hashes = [0u64; LOOKUP_GROUP];
        let mut cand = [EMPTY; LOOKUP_GROUP];
        for ((keys, bytes), out) in keys
            .chunks(LOOKUP_GROUP)
            .zip(bytes.chunks(LOOKUP_GROUP))
            .zip(out.chunks_mut(LOOKUP_GROUP))
        {
            let n = keys.len();
            // Stage 1: hash every key, prefetch its home bucket.
            for i in 0..n {
                let h = self.hasher.hash_one(keys[i]);
                hashes[i] = h;
                prefetch(&self.buckets[self.home(h)]);
            }
            // Stage 2: first tag match in each home bucket, prefetch that entry.
            for i in 0..n {
                let h = hashes[i];
                let tag = Self::tag(h);
                let bucket = &self.buckets[self.home(h)];
                cand[i] = EMPTY;
                for w in 0..BUCKET_WAYS {
                    if bucket.slots[w] != EMPTY && bucket.tags[w] == tag {
                        let slot = &self.entries[bucket.slots[w] as usize];
                        cand[i] = bucket.slots[w];
                        // Every line of the slot, not just the key's: a hit goes on to read the
                        // value (the pipeline's flow entry spans eight lines and its hit path
                        // reads fields in the last one), and a line not prefetched here is a
                        // dependent DRAM miss paid in full per packet.
                        let base = slot as *const Slot<K, V>;
                        for line in 0..Self::SLOT_PREFETCH_LINES {
                            prefetch(base.wrapping_byte_add(64 * line));
                        }
                        break;
                    }
                }
            }
            // Stage 3: confirm the key (falling back to the full probe on a tag collision or an
            // overflowed bucket), update counters.
            for i in 0..n {
                let c = cand[i];
                let found = if c != EMPTY
                    && self.entries[c as usize]
                        .0
                        .as_ref()
                        .is_some_and(|e| e.key == keys[i])
                {
                    Some(c)
                } else {
                    self.find(hashes[i], &keys[i])
                };
                out[i] = self.account(now, found, bytes[i]);
            }
        }
    }

    /// Inserts or replaces `key`. A replaced entry gets the new value, the new `evictable` flag
    /// and fresh metadata (zero counters, `first_seen = last_seen = now`). At capacity the
    /// [`FullPolicy`] decides between eviction and [`TableFull`].
    pub fn insert(
        &mut self,
        now: Instant,
        key: K,
        value: V,
        evictable: bool,
    ) -> Result<Inserted<K>, TableFull> {
        self.insert_indexed(now, key, value, evictable)
            .map(|(_, outcome)| outcome)
    }

    /// [`FlowTable::insert`], also returning the entry's slot index.
    pub fn insert_indexed(
        &mut self,
        now: Instant,
        key: K,
        value: V,
        evictable: bool,
    ) -> Result<(EntryIdx, Inserted<K>), TableFull> {
        let hash = self.hash(&key);
        if let Some(slot) = self.find(hash, &key) {
            self.entries[slot as usize].0 = Some(Entry::fresh(now, key, hash, value, evictable));
            self.counters.inserts += 1;
            return Ok((EntryIdx(slot), Inserted::Replaced));
        }
        let mut outcome = Inserted::Fresh;
        if self.free.is_empty() {
            match self.config.full {
                FullPolicy::Reject => {
                    self.counters.rejected_full += 1;
                    return Err(TableFull {
                        capacity: self.config.capacity,
                    });
                }
                FullPolicy::EvictLeastValuable => match self.pick_victim(now) {
                    Some(slot) => {
                        let victim = self.remove_slot(slot).key;
                        self.counters.evictions += 1;
                        outcome = Inserted::Evicted { victim };
                    }
                    None => {
                        self.counters.rejected_full += 1;
                        return Err(TableFull {
                            capacity: self.config.capacity,
                        });
                    }
                },
            }
        }
        let slot = self.free.pop().expect("a slot is free or was just freed");
        self.entries[slot as usize].0 = Some(Entry::fresh(now, key, hash, value, evictable));
        self.place(hash, slot);
        self.counters.inserts += 1;
        Ok((EntryIdx(slot), outcome))
    }

    /// Puts `slot` in the first bucket with a free pair on `hash`'s probe path.
    fn place(&mut self, hash: u64, slot: u32) {
        let tag = Self::tag(hash);
        let mut b = self.home(hash);
        loop {
            let bucket = &mut self.buckets[b];
            if let Some(w) = bucket.slots.iter().position(|&s| s == EMPTY) {
                bucket.slots[w] = slot;
                bucket.tags[w] = tag;
                return;
            }
            // There are more pairs than entries (buckets * 8 > capacity), so a free pair exists.
            bucket.overflow += 1;
            b = (b + 1) & self.bucket_mask;
        }
    }

    /// Removes the entry at `slot` from the buckets and the slab.
    fn remove_slot(&mut self, slot: u32) -> Entry<K, V> {
        let e = self.entries[slot as usize]
            .0
            .take()
            .expect("remove_slot is called on occupied slots");
        let mut b = self.home(e.hash);
        loop {
            let bucket = &mut self.buckets[b];
            if let Some(w) = bucket.slots.iter().position(|&s| s == slot) {
                bucket.slots[w] = EMPTY;
                break;
            }
            bucket.overflow -= 1;
            b = (b + 1) & self.bucket_mask;
        }
        self.free.push(slot);
        e
    }

    /// The least valuable evictable entry of the next `evict_sample` slots. Only called when
    /// the table is full, so every slot is occupied.
    fn pick_victim(&mut self, now: Instant) -> Option<u32> {
        let cap = self.config.capacity;
        let n = self.config.evict_sample.min(cap);
        let mut best: Option<(bool, u64, K, u32)> = None;
        for i in 0..n {
            let slot = (self.evict_cursor + i) % cap;
            let Some(e) = self.entries[slot].0.as_ref() else {
                continue;
            };
            if !e.evictable {
                continue;
            }
            let metric = match self.config.evict {
                EvictBy::LeastRecentlyUsed => e.last_seen.0,
                EvictBy::FewestPackets => e.packets,
            };
            let rank = (!self.is_idle(e, now), metric, e.key, slot as u32);
            if best.is_none_or(|b| (rank.0, rank.1, rank.2) < (b.0, b.1, b.2)) {
                best = Some(rank);
            }
        }
        self.evict_cursor = (self.evict_cursor + n) % cap;
        best.map(|b| b.3)
    }

    /// Removes `key`, idle or not, returning its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let slot = self.find(self.hash(key), key)?;
        Some(self.remove_slot(slot).value)
    }

    /// Removes idle entries, handing each to `on_expired` in slot order from a cursor. Examines
    /// at most `budget` slots (bounded work per call); returns the number expired.
    pub fn expire(
        &mut self,
        now: Instant,
        budget: usize,
        mut on_expired: impl FnMut(K, V),
    ) -> usize {
        let cap = self.config.capacity;
        let mut n = 0;
        for _ in 0..budget.min(cap) {
            let slot = self.expire_cursor;
            self.expire_cursor = (self.expire_cursor + 1) % cap;
            if self.entries[slot]
                .0
                .as_ref()
                .is_some_and(|e| self.is_idle(e, now))
            {
                let e = self.remove_slot(slot as u32);
                on_expired(e.key, e.value);
                n += 1;
            }
        }
        self.counters.expired += n as u64;
        n
    }

    /// Live entries in slot order (for control-plane dumps and tests; not for the fast path).
    pub fn iter(&self) -> impl Iterator<Item = (EntryIdx, &Entry<K, V>)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.0.as_ref().map(|e| (EntryIdx(i as u32), e)))
    }

    /// Checks the structure's invariants, returning the first violation found. O(capacity).
    pub fn check_invariants(&self) -> Result<(), String> {
        let occupied = self.entries.iter().filter(|e| e.0.is_some()).count();
        if occupied + self.free.len() != self.config.capacity {
            return Err(format!(
                "occupied {occupied} + free {} != capacity {}",
                self.free.len(),
                self.config.capacity
            ));
        }
        for &s in &self.free {
            if self.entries[s as usize].0.is_some() {
                return Err(format!("free slot {s} is occupied"));
            }
        }
        // Recompute the overflow counts from each entry's probe path and compare.
        let mut overflow = vec![0u32; self.buckets.len()];
        let mut seen = vec![false; self.config.capacity];
        for (b, bucket) in self.buckets.iter().enumerate() {
            for w in 0..BUCKET_WAYS {
                let s = bucket.slots[w];
                if s == EMPTY {
                    continue;
                }
                let Some(e) = self.entries.get(s as usize).and_then(|e| e.0.as_ref()) else {
                    return Err(format!("bucket {b} names empty slot {s}"));
                };
                if std::mem::replace(&mut seen[s as usize], true) {
                    return Err(format!("slot {s} is in two bucket pairs"));
                }
                if e.hash != self.hash(&e.key) || bucket.tags[w] != Self::tag(e.hash) {
                    return Err(format!("slot {s}: stale hash or tag"));
                }
                let mut p = self.home(e.hash);
                while p != b {
                    overflow[p] += 1;
                    p = (p + 1) & self.bucket_mask;
                }
            }
        }
        if seen.iter().filter(|&&x| x).count() != occupied {
            return Err("an occupied slot is in no bucket".to_string());
        }
        for (b, bucket) in self.buckets.iter().enumerate() {
            if bucket.overflow != overflow[b] {
                return Err(format!(
                    "bucket {b}: overflow {} expected {}",
                    bucket.overflow, overflow[b]
                ));
            }
        }
        for e in self.entries.iter().filter_map(|e| e.0.as_ref()) {
            if e.last_seen < e.first_seen {
                return Err("last_seen before first_seen".to_string());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(capacity: usize) -> FlowTableConfig {
        FlowTableConfig {
            capacity,
            idle_timeout: Duration::from_secs(10),
            full: FullPolicy::EvictLeastValuable,
            evict: EvictBy::LeastRecentlyUsed,
            evict_sample: capacity,
            hash_seed: 7,
        }
    }

    #[test]
    fn a_train_counts_like_that_many_single_lookups() {
        let mut a: FlowTable<u32, u32> = FlowTable::new(cfg(16)).expect("valid config");
        let mut b: FlowTable<u32, u32> = FlowTable::new(cfg(16)).expect("valid config");
        for t in [&mut a, &mut b] {
            t.insert(Instant(1), 5, 0, true).expect("room");
        }
        assert!(a.lookup_train(Instant(2), &5, 7, 7 * 64).is_some());
        for _ in 0..7 {
            assert!(b.lookup(Instant(2), &5, 64).is_some());
        }
        assert!(a.lookup_train(Instant(2), &6, 3, 3 * 64).is_none());
        for _ in 0..3 {
            assert!(b.lookup(Instant(2), &6, 64).is_none());
        }
        assert_eq!(a.counters(), b.counters());
        let (ea, eb) = (a.get(&5).unwrap().1, b.get(&5).unwrap().1);
        assert_eq!((ea.packets(), ea.bytes()), (eb.packets(), eb.bytes()));
        assert_eq!((ea.packets(), ea.bytes()), (7, 448));
        // Idle entries miss for a whole train too.
        assert!(
            a.lookup_train(Instant(20_000_000_000), &5, 2, 128)
                .is_none()
        );
    }

    #[test]
    fn entry_layout_is_one_cache_line_pair_at_most() {
        assert_eq!(core::mem::size_of::<Bucket>(), 64);
        // A 56-byte key: key + packets fill the first line.
        assert_eq!(core::mem::size_of::<Slot<[u8; 56], u64>>(), 128);
    }

    #[test]
    fn overflowed_bucket_chain_survives_removal() {
        // Capacity 64 -> 16 buckets; force everything into a few buckets with a tiny mask by
        // inserting many keys and removing every other one, checking invariants throughout.
        let mut t: FlowTable<u32, u32> = FlowTable::new(cfg(64)).expect("valid config");
        for k in 0..64 {
            t.insert(Instant(1), k, k, true).expect("room");
            t.check_invariants().expect("invariants");
        }
        for k in (0..64).step_by(2) {
            assert_eq!(t.remove(&k), Some(k));
            t.check_invariants().expect("invariants");
        }
        for k in 0..64 {
            assert_eq!(t.get(&k).is_some(), k % 2 == 1);
        }
    }
}
