//! IP fragment tracking: later fragments follow the verdict their first fragment got.
//!
//! # Tracking, not reassembly
//!
//! Open vSwitch's `ipf` reassembles fragments so conntrack sees whole datagrams, then sends the
//! original fragments on. That costs a buffer per datagram in flight (up to 64 KiB each), a copy,
//! and the latency of the last fragment for every fragment. A virtual switch needs none of it to
//! make the decision: the first fragment (offset 0) carries the whole transport header
//! (RFC 8200 section 4.5 requires the full header chain in it; RFC 1858 is why a first fragment
//! too short for its TCP header is malformed), so the first fragment is decided exactly like an
//! unfragmented packet (anti-spoofing, conntrack, security groups, route, SNAT), and the
//! decision (its output port and header rewrites, an [`crate::action::ActionList`]) is
//! remembered under the datagram's identity. Later fragments apply the same rewrites: SNAT and
//! un-SNAT change only the IP address (and IPv4 header checksum) of a later fragment, overlay
//! encapsulation and decapsulation are IP-level anyway, and the incremental L4 checksum update
//! on the first fragment is right because the transport checksum covers the whole datagram. So
//! nothing is buffered and each fragment leaves as soon as it arrives.
//!
//! A datagram is identified as RFC 791 section 3.2 (IPv4: source, destination, protocol,
//! identification) and RFC 8200 section 4.5 (IPv6: source, destination, identification; the
//! protocol is 0 in the key) do, inside a *zone*: the ingress port and, for frames that arrived
//! over VXLAN, the VNI. A VM port names its VM (and so its tenant), a VNI its tenant, so the
//! same identification from two tenants or two VMs names two datagrams.
//!
//! # Security
//!
//! A later fragment is forwarded only when a first fragment of the same datagram from the same
//! zone was admitted, and then only where that first fragment went. Nothing can bypass a
//! security group by fragmenting: without a tracked first fragment a later fragment is dropped
//! (`DropReason::FragmentNoFirst`), and a fragment whose bytes overlap bytes already seen (the
//! RFC 1858 overlapping-fragment attack that rewrites a port after the check) poisons the whole
//! datagram, as RFC 5722 asks for IPv6 and Linux does for both families: it and every later
//! fragment of that datagram are dropped (`FragmentOverlap`).
//!
//! # Out of order: dropped, not held back
//!
//! A later fragment that arrives before its first is dropped and counted (`FragmentNoFirst`)
//! rather than held. Holding it would need a bounded buffer pool with copies and a per-tenant
//! budget on it, for a case that is rare on this path: senders emit a datagram's fragments in
//! order (Linux `ip_fragment` does), and between a VM and its vSwitch, or across one underlay
//! hop, they are not reordered. The cost of the rare reorder is one lost datagram, which the
//! application already handles (UDP) or retransmits (TCP over a small PMTU). The counter tells an
//! operator if that assumption ever stops holding.
//!
//! # Limits
//!
//! - [`FragConfig::entries_max`] datagrams in flight (default 1024, 16..=65536), preallocated;
//!   [`FragConfig::zone_entries_max`] of them per zone (default 256), so one VM flooding first
//!   fragments that never complete cannot take every slot from the others.
//! - [`FragConfig::fragments_max`] fragments per datagram (default 64, 2..=64): a 64 KiB
//!   datagram over a 1280-byte IPv6 path is 52 fragments; more is an attack, and the datagram is
//!   poisoned (`FragmentTooMany`).
//! - [`FragConfig::timeout`] from the first fragment (default 10 s, 100 ms..=120 s). A datagram
//!   whose fragments all arrived is released at once (its last byte completes it), so only
//!   datagrams that lost a fragment wait out the timeout. A later fragment that finds its
//!   datagram expired is dropped (`FragmentTimeout`).
//! - When the table or the zone is full, expired datagrams are reclaimed first (a scan, only
//!   when full and only once something can have expired); if none, the first fragment is
//!   dropped (`FragmentTableFull`): better than forwarding a head whose tail would be dropped.
//!
//! Nothing allocates after [`FragTable::new`]: slots, free list and the hashbrown index (reserved
//! at four times the capacity, as in `conntrack`, so tombstones are cleaned in place) are
//! preallocated, and a datagram's byte ranges live in a fixed array.

use core::hash::BuildHasher;
use core::time::Duration;

use foldhash::fast::FixedState;
use hashbrown::HashTable;
use spillway_wire::IpAddr16;

use crate::ids::PortId;
use crate::time::Instant;

/// Most fragments per datagram the table can record (the upper bound of `fragments_max`).
pub const FRAGMENTS_MAX: usize = 64;

/// Where a datagram came from: the ingress port and the VNI it arrived under, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FragZone {
    /// The ingress port.
    pub port: PortId,
    /// The VNI for frames that arrived over VXLAN; `None` for everything else.
    pub vni: Option<u32>,
}

/// The identity of one datagram (RFC 791 section 3.2, RFC 8200 section 4.5) within a zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FragKey {
    /// Where it came from.
    pub zone: FragZone,
    /// Source address.
    pub src: IpAddr16,
    /// Destination address.
    pub dst: IpAddr16,
    /// IPv4 protocol; 0 for IPv6, whose fragments are identified without it.
    pub proto: u8,
    /// Identification (16 bits for IPv4, 32 for IPv6).
    pub id: u32,
}

/// One fragment's place in its datagram: the byte range `[start, end)` of the fragmentable
/// part it carries and whether more fragments follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragPiece {
    /// First byte (offset field times 8).
    pub start: u32,
    /// One past the last byte.
    pub end: u32,
    /// More-fragments flag.
    pub more: bool,
}

/// Why a fragment was not admitted; the pipeline maps each to a `DropReason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FragDrop {
    /// A later fragment without a tracked first fragment (never seen, denied, or dropped).
    #[error("no first fragment")]
    NoFirst,
    /// The fragment overlaps bytes already seen, or contradicts the datagram's end; the whole
    /// datagram is dropped (RFC 5722).
    #[error("overlapping fragment")]
    Overlap,
    /// More than `fragments_max` fragments; the whole datagram is dropped.
    #[error("too many fragments")]
    TooMany,
    /// No room for a new datagram (table or zone budget), nothing expired to reclaim.
    #[error("fragment table full")]
    TableFull,
    /// The datagram's timeout passed before this fragment arrived.
    #[error("fragment timeout")]
    Timeout,
}

/// Fragment tracking configuration (see the module doc for the defaults and their reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragConfig {
    /// Datagrams in flight, 16..=65536.
    pub entries_max: usize,
    /// Datagrams in flight per zone, 1..=`entries_max`.
    pub zone_entries_max: usize,
    /// Fragments per datagram, 2..=[`FRAGMENTS_MAX`].
    pub fragments_max: usize,
    /// Lifetime of a datagram's state from its first fragment, 100 ms..=120 s.
    pub timeout: Duration,
    /// Seed of the index hash.
    pub hash_seed: u64,
}

impl Default for FragConfig {
    fn default() -> Self {
        FragConfig {
            entries_max: 1024,
            zone_entries_max: 256,
            fragments_max: FRAGMENTS_MAX,
            timeout: Duration::from_secs(10),
            hash_seed: 0xf4a6_0000_1d5e_ed00,
        }
    }
}

/// A [`FragConfig`] field outside its documented range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fragment table: {field} = {actual} is outside {min}..={max}")]
pub struct FragConfigError {
    /// The field.
    pub field: &'static str,
    /// Its value (milliseconds for `timeout`).
    pub actual: u64,
    /// Smallest allowed.
    pub min: u64,
    /// Largest allowed.
    pub max: u64,
}

impl FragConfig {
    /// Checks every field against its range.
    pub fn validate(&self) -> Result<(), FragConfigError> {
        let check = |field, actual: u64, min, max| {
            if (min..=max).contains(&actual) {
                Ok(())
            } else {
                Err(FragConfigError {
                    field,
                    actual,
                    min,
                    max,
                })
            }
        };
        check("entries_max", self.entries_max as u64, 16, 65536)?;
        check(
            "zone_entries_max",
            self.zone_entries_max as u64,
            1,
            self.entries_max as u64,
        )?;
        check(
            "fragments_max",
            self.fragments_max as u64,
            2,
            FRAGMENTS_MAX as u64,
        )?;
        check(
            "timeout",
            u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            100,
            120_000,
        )
    }
}

crate::counters! {
    /// Event counters (`vswitch.frag.*`).
    #[derive(Copy, PartialEq, Eq)]
    pub struct FragCounters {
        /// First fragments whose datagram is now tracked.
        tracked => "vswitch.frag.tracked",
        /// Later fragments admitted under their first fragment's verdict.
        followed => "vswitch.frag.followed",
        /// Datagrams released because every byte was seen.
        completed => "vswitch.frag.completed",
        /// Datagrams released by timeout (reclaimed or found expired).
        expired => "vswitch.frag.expired",
    }
}

/// The state of one datagram.
///
/// ```text
///   first fragment admitted ──> Admitted ──(overlap / too many)──> Poisoned
///                                  │                                  │
///                   (all bytes seen) or timeout            timeout or reclaim
///                                  v                                  v
///                               (freed)                            (freed)
/// ```
///
/// `Admitted` is entered only from a first fragment the pipeline forwarded; `Poisoned` only
/// from `Admitted`, by a fragment that overlapped or exceeded the fragment budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DatagramState {
    /// Later fragments follow the stored verdict.
    Admitted,
    /// Every further fragment is dropped with this reason until the datagram times out.
    Poisoned(FragDrop),
}

#[derive(Clone, Copy, Debug)]
struct Datagram<V> {
    key: FragKey,
    deadline: Instant,
    state: DatagramState,
    value: V,
    /// Fragments seen, the first included.
    fragments: u8,
    /// Disjoint, sorted byte ranges seen, adjacent ones merged.
    ranges: [(u32, u32); FRAGMENTS_MAX],
    ranges_len: u8,
    /// The datagram's fragmentable length, once its last fragment (MF clear) was seen.
    total: Option<u32>,
    /// Bytes seen (the ranges never overlap, so this is their sum).
    received: u32,
}

impl<V: Copy> Datagram<V> {
    /// Records `p` if it fits: no overlap, consistent with the end. Returns whether it did.
    fn record(&mut self, p: FragPiece) -> bool {
        let ranges = &self.ranges[..usize::from(self.ranges_len)];
        let max_end = ranges.last().map_or(0, |r| r.1);
        let consistent = match (self.total, p.more) {
            (Some(t), _) if p.end > t => false,
            (Some(t), false) => p.end == t,
            (None, false) => p.end >= max_end,
            (_, true) => true,
        };
        if !consistent || p.end <= p.start || ranges.iter().any(|r| p.start < r.1 && r.0 < p.end) {
            return false;
        }
        // Insert in order, absorbing touching neighbours: fragments arriving in order keep a
        // single range. No range overlaps `p` (checked above), so each lies wholly before or
        // after it.
        let mut tmp = [(0u32, 0u32); FRAGMENTS_MAX];
        let (mut lo, mut hi) = (p.start, p.end);
        let mut m = 0;
        let mut placed = false;
        for &r in ranges {
            if r.1 == lo {
                lo = r.0;
                continue;
            }
            if r.0 == hi {
                hi = r.1;
                continue;
            }
            if r.0 > hi && !placed {
                tmp[m] = (lo, hi);
                m += 1;
                placed = true;
            }
            tmp[m] = r;
            m += 1;
        }
        if !placed {
            tmp[m] = (lo, hi);
            m += 1;
        }
        self.ranges = tmp;
        self.ranges_len = m as u8;
        self.received += p.end - p.start;
        if !p.more {
            self.total = Some(p.end);
        }
        true
    }

    fn complete(&self) -> bool {
        self.total == Some(self.received)
    }
}

/// The fragment table. See the module doc.
#[derive(Debug)]
pub struct FragTable<V> {
    config: FragConfig,
    slots: Vec<Option<Datagram<V>>>,
    free: Vec<u32>,
    index: HashTable<u32>,
    /// Per-zone datagram counts, indexed like `slots` by a second table (zone -> count slot).
    zones: HashTable<(FragZone, u32)>,
    hasher: FixedState,
    /// No datagram expires before this; a full table skips its reclaim scan until then.
    earliest_deadline: Instant,
    /// Where the next [`FragTable::expire`] sweep resumes.
    sweep_at: usize,
    counters: FragCounters,
}

impl<V: Copy + core::fmt::Debug> FragTable<V> {
    /// An empty table with all its memory allocated.
    pub fn new(config: FragConfig) -> Result<FragTable<V>, FragConfigError> {
        config.validate()?;
        let n = config.entries_max;
        Ok(FragTable {
            config,
            slots: vec![None; n],
            free: (0..n as u32).rev().collect(),
            index: HashTable::with_capacity(4 * n),
            zones: HashTable::with_capacity(4 * n),
            hasher: FixedState::with_seed(config.hash_seed),
            earliest_deadline: Instant(u64::MAX),
            sweep_at: 0,
            counters: FragCounters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FragConfig {
        &self.config
    }

    /// Datagrams held, expired-but-unreclaimed ones included.
    pub fn len(&self) -> usize {
        self.config.entries_max - self.free.len()
    }

    /// Whether no datagram is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Event counters.
    pub fn counters(&self) -> FragCounters {
        self.counters
    }

    fn find(&self, key: &FragKey) -> Option<u32> {
        let h = self.hasher.hash_one(key);
        self.index
            .find(h, |&s| {
                self.slots[s as usize]
                    .as_ref()
                    .is_some_and(|d| d.key == *key)
            })
            .copied()
    }

    fn zone_count(&self, zone: FragZone) -> u32 {
        let h = self.hasher.hash_one(zone);
        self.zones
            .find(h, |(z, _)| *z == zone)
            .map_or(0, |(_, c)| *c)
    }

    fn zone_add(&mut self, zone: FragZone, delta: i32) {
        let h = self.hasher.hash_one(zone);
        let hasher = &self.hasher;
        match self
            .zones
            .entry(h, |(z, _)| *z == zone, |(z, _)| hasher.hash_one(z))
        {
            hashbrown::hash_table::Entry::Occupied(mut o) => {
                let c = o.get().1.saturating_add_signed(delta);
                if c == 0 {
                    o.remove();
                } else {
                    o.get_mut().1 = c;
                }
            }
            hashbrown::hash_table::Entry::Vacant(v) => {
                debug_assert!(delta > 0, "a zone without datagrams loses none");
                v.insert((zone, delta.max(0) as u32));
            }
        }
    }

    fn remove(&mut self, slot: u32) {
        let d = self.slots[slot as usize]
            .take()
            .expect("remove is called on live slots");
        let h = self.hasher.hash_one(d.key);
        if let Ok(e) = self.index.find_entry(h, |&s| s == slot) {
            e.remove();
        }
        self.zone_add(d.key.zone, -1);
        self.free.push(slot);
    }

    /// Frees every expired datagram; a scan, run only when the table or a zone is full.
    fn reclaim_expired(&mut self, now: Instant) {
        if now < self.earliest_deadline {
            return;
        }
        let mut earliest = Instant(u64::MAX);
        for s in 0..self.slots.len() {
            let Some(d) = self.slots[s].as_ref() else {
                continue;
            };
            if d.deadline <= now {
                self.remove(s as u32);
                self.counters.expired += 1;
            } else {
                earliest = earliest.min(d.deadline);
            }
        }
        self.earliest_deadline = earliest;
    }

    /// Frees expired datagrams among the next `budget` slots, resuming where the last call
    /// stopped, so a periodic caller bounds its cost per call and still visits every slot.
    /// Returns how many it freed. (Without it, expired datagrams wait until the table or their
    /// zone fills; either way nothing expired is ever followed.)
    pub fn expire(&mut self, now: Instant, budget: usize) -> usize {
        if now < self.earliest_deadline || self.is_empty() {
            return 0;
        }
        let n = self.slots.len();
        let mut freed = 0;
        for _ in 0..budget.min(n) {
            let s = self.sweep_at;
            self.sweep_at = (s + 1) % n;
            if self.slots[s].as_ref().is_some_and(|d| d.deadline <= now) {
                self.remove(s as u32);
                self.counters.expired += 1;
                freed += 1;
            }
        }
        freed
    }

    /// Tracks the datagram of a first fragment the pipeline has decided to forward with
    /// `value`. Fails when the datagram is already tracked (a second first fragment overlaps
    /// the first: the datagram is poisoned) or there is no room.
    pub fn track_first(
        &mut self,
        now: Instant,
        key: FragKey,
        piece: FragPiece,
        value: V,
    ) -> Result<(), FragDrop> {
        debug_assert_eq!(piece.start, 0, "a first fragment starts at 0");
        if let Some(slot) = self.find(&key) {
            let d = self.slots[slot as usize]
                .as_mut()
                .expect("find returns live slots");
            if d.deadline > now {
                let r = match d.state {
                    DatagramState::Poisoned(r) => r,
                    DatagramState::Admitted => FragDrop::Overlap,
                };
                d.state = DatagramState::Poisoned(r);
                return Err(r);
            }
            self.remove(slot);
            self.counters.expired += 1;
        }
        if self.free.is_empty()
            || self.zone_count(key.zone) as usize >= self.config.zone_entries_max
        {
            self.reclaim_expired(now);
        }
        if self.free.is_empty()
            || self.zone_count(key.zone) as usize >= self.config.zone_entries_max
        {
            return Err(FragDrop::TableFull);
        }
        let mut d = Datagram {
            key,
            deadline: now + self.config.timeout,
            state: DatagramState::Admitted,
            value,
            fragments: 1,
            ranges: [(0, 0); FRAGMENTS_MAX],
            ranges_len: 0,
            total: None,
            received: 0,
        };
        if !d.record(piece) {
            // An empty first fragment: nothing to track, and nothing sane to follow.
            return Err(FragDrop::Overlap);
        }
        self.counters.tracked += 1;
        if d.complete() {
            // A "first fragment" with MF clear is not one; nothing follows it.
            self.counters.completed += 1;
            return Ok(());
        }
        let slot = self.free.pop().expect("checked above");
        self.earliest_deadline = self.earliest_deadline.min(d.deadline);
        self.slots[slot as usize] = Some(d);
        let h = self.hasher.hash_one(key);
        let slots = &self.slots;
        let hasher = &self.hasher;
        self.index.insert_unique(h, slot, |&s| {
            hasher.hash_one(
                slots[s as usize]
                    .as_ref()
                    .expect("indexed slots are live")
                    .key,
            )
        });
        self.zone_add(key.zone, 1);
        Ok(())
    }

    /// A later fragment: the verdict its first fragment got, or why it is dropped.
    pub fn follow(&mut self, now: Instant, key: FragKey, piece: FragPiece) -> Result<V, FragDrop> {
        let Some(slot) = self.find(&key) else {
            return Err(FragDrop::NoFirst);
        };
        let fragments_max = self.config.fragments_max;
        let d = self.slots[slot as usize]
            .as_mut()
            .expect("find returns live slots");
        if d.deadline <= now {
            self.remove(slot);
            self.counters.expired += 1;
            return Err(FragDrop::Timeout);
        }
        if let DatagramState::Poisoned(r) = d.state {
            return Err(r);
        }
        if usize::from(d.fragments) >= fragments_max {
            d.state = DatagramState::Poisoned(FragDrop::TooMany);
            return Err(FragDrop::TooMany);
        }
        if !d.record(piece) {
            d.state = DatagramState::Poisoned(FragDrop::Overlap);
            return Err(FragDrop::Overlap);
        }
        d.fragments += 1;
        let value = d.value;
        self.counters.followed += 1;
        if d.complete() {
            self.remove(slot);
            self.counters.completed += 1;
        }
        Ok(value)
    }

    /// Checks the table's invariants; the error names the broken one.
    pub fn check_invariants(&self) -> Result<(), String> {
        let fail = |what: &str| Err(format!("fragment table: {what}"));
        let live = self.slots.iter().filter(|s| s.is_some()).count();
        if live != self.len() || self.len() > self.config.entries_max {
            return fail("free list, slots and capacity disagree");
        }
        if self.index.len() != live {
            return fail("not one index entry per datagram");
        }
        let zone_sum: u32 = self.zones.iter().map(|(_, c)| *c).sum();
        if zone_sum as usize != live {
            return fail("zone counts do not sum to the datagrams");
        }
        if self
            .zones
            .iter()
            .any(|(_, c)| *c as usize > self.config.zone_entries_max)
        {
            return fail("a zone is over its budget");
        }
        for d in self.slots.iter().flatten() {
            if self.find(&d.key).is_none() {
                return fail("a datagram is not indexed");
            }
            if d.deadline < self.earliest_deadline {
                return fail("earliest deadline is not a lower bound");
            }
            let r = &d.ranges[..usize::from(d.ranges_len)];
            if !r.windows(2).all(|w| w[0].1 < w[1].0) {
                return fail("ranges overlap, touch or are unsorted");
            }
            if r.iter().map(|(a, b)| b - a).sum::<u32>() != d.received {
                return fail("received bytes differ from the ranges");
            }
            if d.complete() {
                return fail("a complete datagram is still held");
            }
            if usize::from(d.fragments) > self.config.fragments_max {
                return fail("more fragments than the budget");
            }
        }
        Ok(())
    }
}
