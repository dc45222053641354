//! Differential and behavioural tests of `FlowTable`.
//!
//! The proptest drives the real table and a tiny reference model (a `BTreeMap` from key to value
//! and metadata, with eviction as a linear scan for the minimum `(not idle, metric, key)`) through
//! random sequences of insert, lookup, batch lookup, remove, expire and time advances on small
//! tables (capacity 1..=64). `evict_sample >= capacity` makes eviction exact, so the model predicts
//! every victim. After every step both must agree on the operation's result, on every entry's
//! value and metadata, on `len` and on all counters, and the table must pass `check_invariants`.
//! Partial `expire` budgets are checked by letting the table choose what to expire (it walks a
//! cursor the model does not model) and requiring that every expired key was idle in the model.
//! The named unit tests pin down the behaviours the rest of the vSwitch relies on: value-based
//! eviction, Reject mode counting, pinned entries, sampled eviction and idle handling.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use spillway_vswitch::Instant;
use spillway_vswitch::flow_table::{
    EntryIdx, EvictBy, FlowTable, FlowTableConfig, FlowTableConfigError, FlowTableCounters,
    FullPolicy, Inserted, TableFull,
};

type Key = u16;

#[derive(Clone, Debug, PartialEq)]
struct ModelEntry {
    value: u32,
    packets: u64,
    bytes: u64,
    first_seen: Instant,
    last_seen: Instant,
    evictable: bool,
}

/// The reference: a BTreeMap and linear scans.
struct Model {
    cfg: FlowTableConfig,
    map: BTreeMap<Key, ModelEntry>,
    counters: FlowTableCounters,
}

impl Model {
    fn idle(&self, e: &ModelEntry, now: Instant) -> bool {
        e.evictable && now - e.last_seen >= self.cfg.idle_timeout
    }

    fn lookup(&mut self, now: Instant, key: Key, bytes: u32) -> bool {
        let timeout = self.cfg.idle_timeout;
        match self.map.get_mut(&key) {
            Some(e) if !(e.evictable && now - e.last_seen >= timeout) => {
                e.packets += 1;
                e.bytes += u64::from(bytes);
                e.last_seen = e.last_seen.max(now);
                self.counters.hits += 1;
                true
            }
            _ => {
                self.counters.misses += 1;
                false
            }
        }
    }

    fn insert(
        &mut self,
        now: Instant,
        key: Key,
        value: u32,
        evictable: bool,
    ) -> Result<Inserted<Key>, TableFull> {
        let fresh = ModelEntry {
            value,
            packets: 0,
            bytes: 0,
            first_seen: now,
            last_seen: now,
            evictable,
        };
        if let Some(e) = self.map.get_mut(&key) {
            *e = fresh;
            self.counters.inserts += 1;
            return Ok(Inserted::Replaced);
        }
        let full = TableFull {
            capacity: self.cfg.capacity,
        };
        let mut outcome = Inserted::Fresh;
        if self.map.len() == self.cfg.capacity {
            if self.cfg.full == FullPolicy::Reject {
                self.counters.rejected_full += 1;
                return Err(full);
            }
            let victim = self
                .map
                .iter()
                .filter(|(_, e)| e.evictable)
                .min_by_key(|(k, e)| {
                    let metric = match self.cfg.evict {
                        EvictBy::LeastRecentlyUsed => e.last_seen.0,
                        EvictBy::FewestPackets => e.packets,
                    };
                    (!self.idle(e, now), metric, **k)
                })
                .map(|(k, _)| *k);
            let Some(victim) = victim else {
                self.counters.rejected_full += 1;
                return Err(full);
            };
            self.map.remove(&victim);
            self.counters.evictions += 1;
            outcome = Inserted::Evicted { victim };
        }
        self.map.insert(key, fresh);
        self.counters.inserts += 1;
        Ok(outcome)
    }
}

#[derive(Clone, Debug)]
enum Op {
    Insert(Key, u32, bool),
    Lookup(Key, u32),
    Batch(Vec<(Key, u32)>),
    Remove(Key),
    Expire(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u16..40;
    prop_oneof![
        4 => (key.clone(), any::<u32>(), prop::bool::weighted(0.85)).prop_map(|(k, v, e)| Op::Insert(k, v, e)),
        4 => (key.clone(), 0u32..1500).prop_map(|(k, b)| Op::Lookup(k, b)),
        2 => prop::collection::vec((key.clone(), 0u32..1500), 0..70).prop_map(Op::Batch),
        1 => key.prop_map(Op::Remove),
        1 => (0usize..80).prop_map(Op::Expire),
        2 => (0u64..15).prop_map(Op::Advance),
    ]
}

fn config() -> impl Strategy<Value = FlowTableConfig> {
    (
        1usize..=64,
        1u64..40,
        any::<bool>(),
        any::<bool>(),
        0usize..3,
        any::<u64>(),
    )
        .prop_map(
            |(capacity, idle, reject, fewest, extra, hash_seed)| FlowTableConfig {
                capacity,
                // Time is counted in whole nanoseconds so the model and table share one unit.
                idle_timeout: Duration::from_nanos(idle),
                full: if reject {
                    FullPolicy::Reject
                } else {
                    FullPolicy::EvictLeastValuable
                },
                evict: if fewest {
                    EvictBy::FewestPackets
                } else {
                    EvictBy::LeastRecentlyUsed
                },
                evict_sample: capacity + extra,
                hash_seed,
            },
        )
}

fn assert_same(t: &FlowTable<Key, u32>, m: &Model) {
    t.check_invariants().expect("table invariants");
    assert_eq!(t.len(), m.map.len(), "len");
    assert_eq!(t.counters(), m.counters, "counters");
    for (k, me) in &m.map {
        let (_, e) = t.get(k).expect("model key present in table");
        let got = ModelEntry {
            value: *e.value(),
            packets: e.packets(),
            bytes: e.bytes(),
            first_seen: e.first_seen(),
            last_seen: e.last_seen(),
            evictable: e.evictable(),
        };
        assert_eq!(&got, me, "entry {k}");
    }
    let keys: Vec<Key> = t.iter().map(|(_, e)| *e.key()).collect();
    assert_eq!(keys.len(), m.map.len(), "no extra keys");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn flow_table_matches_reference_model(cfg in config(), ops in prop::collection::vec(op(), 1..200)) {
        let mut t: FlowTable<Key, u32> = FlowTable::new(cfg).expect("valid config");
        let mut m = Model { cfg, map: BTreeMap::new(), counters: FlowTableCounters::default() };
        let mut now = Instant(1_000);
        for op in ops {
            match op {
                Op::Insert(k, v, e) => {
                    prop_assert_eq!(t.insert(now, k, v, e), m.insert(now, k, v, e));
                }
                Op::Lookup(k, b) => {
                    let got = t.lookup(now, &k, b);
                    prop_assert_eq!(got.is_some(), m.lookup(now, k, b));
                    if let Some(idx) = got {
                        prop_assert_eq!(*t.entry(idx).key(), k);
                    }
                }
                Op::Batch(pkts) => {
                    let keys: Vec<Key> = pkts.iter().map(|p| p.0).collect();
                    let bytes: Vec<u32> = pkts.iter().map(|p| p.1).collect();
                    let mut out = vec![None; pkts.len()];
                    t.lookup_batch(now, &keys, &bytes, &mut out);
                    for (i, &(k, b)) in pkts.iter().enumerate() {
                        prop_assert_eq!(out[i].is_some(), m.lookup(now, k, b));
                        if let Some(idx) = out[i] {
                            prop_assert_eq!(*t.entry(idx).key(), k);
                        }
                    }
                }
                Op::Remove(k) => {
                    prop_assert_eq!(t.remove(&k), m.map.remove(&k).map(|e| e.value));
                }
                Op::Expire(budget) => {
                    let mut gone = Vec::new();
                    let n = t.expire(now, budget, |k, v| gone.push((k, v)));
                    prop_assert_eq!(n, gone.len());
                    prop_assert!(n <= budget);
                    for (k, v) in gone {
                        let e = m.map.remove(&k).expect("expired key was in the model");
                        prop_assert!(m.idle(&e, now), "expired key {} was not idle", k);
                        prop_assert_eq!(e.value, v);
                    }
                    m.counters.expired += n as u64;
                    if budget >= cfg.capacity {
                        // A full sweep leaves no idle entry behind.
                        let idle = m.map.values().filter(|e| m.idle(e, now)).count();
                        prop_assert_eq!(idle, 0);
                    }
                }
                Op::Advance(dt) => now = Instant(now.0 + dt),
            }
            assert_same(&t, &m);
        }
    }

    #[test]
    fn lookup_batch_agrees_with_single_lookups(seed in any::<u64>(), n in 1usize..3000) {
        // Two identical tables large enough for overflowed buckets and several batch groups.
        let cfg = FlowTableConfig { capacity: 4096, hash_seed: seed, ..FlowTableConfig::default() };
        let mut a: FlowTable<u64, u64> = FlowTable::new(cfg).expect("valid config");
        let mut b: FlowTable<u64, u64> = FlowTable::new(cfg).expect("valid config");
        for k in 0..n as u64 {
            a.insert(Instant(1), k * 7, k, true).expect("room");
            b.insert(Instant(1), k * 7, k, true).expect("room");
        }
        let keys: Vec<u64> = (0..(2 * n as u64)).map(|k| k * 7 / 2).collect();
        let bytes = vec![100u32; keys.len()];
        let mut out = vec![None; keys.len()];
        a.lookup_batch(Instant(2), &keys, &bytes, &mut out);
        for (i, k) in keys.iter().enumerate() {
            prop_assert_eq!(out[i], b.lookup(Instant(2), k, 100));
        }
        prop_assert_eq!(a.counters(), b.counters());
    }
}

fn small(capacity: usize, full: FullPolicy, evict: EvictBy) -> FlowTable<Key, u32> {
    FlowTable::new(FlowTableConfig {
        capacity,
        idle_timeout: Duration::from_secs(10),
        full,
        evict,
        evict_sample: capacity,
        hash_seed: 1,
    })
    .expect("valid config")
}

const T0: Instant = Instant(1_000_000_000);

fn at(secs: u64) -> Instant {
    Instant(T0.0 + secs * 1_000_000_000)
}

#[test]
fn hw_table_evicts_lowest_value_when_full() {
    let mut t = small(3, FullPolicy::EvictLeastValuable, EvictBy::FewestPackets);
    for k in 1..=3 {
        assert_eq!(t.insert(T0, k, 0, true), Ok(Inserted::Fresh));
    }
    for (k, pkts) in [(1, 5), (2, 1), (3, 3)] {
        for _ in 0..pkts {
            t.lookup(T0, &k, 64).expect("hit");
        }
    }
    assert_eq!(
        t.insert(T0, 4, 0, true),
        Ok(Inserted::Evicted { victim: 2 })
    );
    assert!(t.get(&2).is_none());
    assert_eq!(t.counters().evictions, 1);
    t.check_invariants().expect("invariants");
}

#[test]
fn lru_table_evicts_oldest_last_seen_ties_by_key() {
    let mut t = small(
        3,
        FullPolicy::EvictLeastValuable,
        EvictBy::LeastRecentlyUsed,
    );
    t.insert(at(0), 30, 0, true).expect("room");
    t.insert(at(0), 20, 0, true).expect("room");
    t.insert(at(0), 10, 0, true).expect("room");
    t.lookup(at(1), &10, 1).expect("hit");
    // 20 and 30 share last_seen = at(0); the smaller key goes first.
    assert_eq!(
        t.insert(at(2), 40, 0, true),
        Ok(Inserted::Evicted { victim: 20 })
    );
}

#[test]
fn reject_mode_refuses_and_counts_when_full() {
    let mut t = small(2, FullPolicy::Reject, EvictBy::LeastRecentlyUsed);
    t.insert(T0, 1, 0, true).expect("room");
    t.insert(T0, 2, 0, true).expect("room");
    assert_eq!(t.insert(T0, 3, 0, true), Err(TableFull { capacity: 2 }));
    assert_eq!(t.insert(T0, 4, 0, true), Err(TableFull { capacity: 2 }));
    assert_eq!(t.counters().rejected_full, 2);
    // Replacing an existing key needs no room.
    assert_eq!(t.insert(T0, 2, 9, true), Ok(Inserted::Replaced));
    assert_eq!(t.len(), 2);
}

#[test]
fn pinned_entries_are_never_evicted_or_expired() {
    let mut t = small(
        2,
        FullPolicy::EvictLeastValuable,
        EvictBy::LeastRecentlyUsed,
    );
    t.insert(T0, 1, 0, false).expect("room");
    t.insert(T0, 2, 0, false).expect("room");
    assert_eq!(
        t.insert(at(100), 3, 0, true),
        Err(TableFull { capacity: 2 })
    );
    assert_eq!(t.counters().rejected_full, 1);
    assert_eq!(t.expire(at(1_000), 10, |_, _| panic!("pinned expired")), 0);
    assert!(t.lookup(at(1_000), &1, 1).is_some());
}

#[test]
fn sampled_eviction_takes_evictable_victims_and_spares_pinned() {
    let cap = 200;
    let mut t: FlowTable<u32, u32> = FlowTable::new(FlowTableConfig {
        capacity: cap,
        idle_timeout: Duration::from_secs(10),
        full: FullPolicy::EvictLeastValuable,
        evict: EvictBy::LeastRecentlyUsed,
        evict_sample: 4,
        hash_seed: 3,
    })
    .expect("valid config");
    // Every third entry pinned.
    for k in 0..cap as u32 {
        t.insert(T0, k, k, k % 3 != 0).expect("room");
    }
    let mut evicted = 0;
    for k in 1000..1400u32 {
        match t.insert(at(1), k, k, true) {
            Ok(Inserted::Evicted { victim }) => {
                evicted += 1;
                assert!(victim % 3 != 0 || victim >= 1000, "pinned {victim} evicted");
            }
            Ok(other) => panic!("table is full, got {other:?}"),
            Err(TableFull { .. }) => panic!("every sample of 4 holds an evictable entry"),
        }
        t.check_invariants().expect("invariants");
    }
    assert_eq!(evicted, 400);
    for k in (0..cap as u32).filter(|k| k % 3 == 0) {
        assert!(t.get(&k).is_some(), "pinned {k} still present");
    }
}

#[test]
fn idle_entry_is_a_miss_until_expire_hands_it_over() {
    let mut t = small(
        4,
        FullPolicy::EvictLeastValuable,
        EvictBy::LeastRecentlyUsed,
    );
    t.insert(T0, 1, 11, true).expect("room");
    t.insert(T0, 2, 22, true).expect("room");
    assert!(t.lookup(at(9), &2, 1).is_some());
    assert!(
        t.lookup(at(10), &1, 1).is_none(),
        "idle for exactly the timeout"
    );
    assert_eq!(t.len(), 2, "idle entry stays until expire");
    let mut got = Vec::new();
    assert_eq!(t.expire(at(10), 4, |k, v| got.push((k, v))), 1);
    assert_eq!(got, vec![(1, 11)]);
    assert_eq!(t.counters().expired, 1);
    assert_eq!(t.counters().misses, 1);
}

#[test]
fn expire_examines_at_most_budget_slots_and_resumes() {
    let mut t = small(
        16,
        FullPolicy::EvictLeastValuable,
        EvictBy::LeastRecentlyUsed,
    );
    for k in 0..16 {
        t.insert(T0, k, 0, true).expect("room");
    }
    let mut total = 0;
    for _ in 0..4 {
        let n = t.expire(at(60), 4, |_, _| {});
        assert!(n <= 4);
        total += n;
    }
    assert_eq!(total, 16);
    assert!(t.is_empty());
}

#[test]
fn entry_index_is_stable_across_other_inserts_and_removes() {
    let mut t = small(
        64,
        FullPolicy::EvictLeastValuable,
        EvictBy::LeastRecentlyUsed,
    );
    t.insert(T0, 5, 55, true).expect("room");
    let idx: EntryIdx = t.lookup(T0, &5, 1).expect("hit");
    for k in 10..60 {
        t.insert(T0, k, 0, true).expect("room");
    }
    for k in 10..40 {
        t.remove(&k);
    }
    assert_eq!(t.lookup(T0, &5, 1), Some(idx));
    assert_eq!(*t.value(idx), 55);
    *t.value_mut(idx) = 56;
    assert_eq!(t.get_mut(&5).copied(), Some(56));
}

#[test]
fn bad_configs_are_typed_errors() {
    let zero = FlowTableConfig {
        capacity: 0,
        ..FlowTableConfig::default()
    };
    assert!(matches!(
        FlowTable::<u8, u8>::new(zero),
        Err(FlowTableConfigError::Capacity { actual: 0, .. })
    ));
    let no_sample = FlowTableConfig {
        evict_sample: 0,
        ..FlowTableConfig::default()
    };
    assert_eq!(
        FlowTable::<u8, u8>::new(no_sample).err(),
        Some(FlowTableConfigError::EvictSampleZero)
    );
}
