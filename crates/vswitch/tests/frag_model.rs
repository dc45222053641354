//! Differential test of `FragTable` against a reference model.
//!
//! The model keeps each datagram in a `BTreeMap` with the set of every byte position seen (no
//! ranges, no merging, no index, no per-zone counters: just sets and linear counts), and
//! implements the rules of `frag.rs`'s module doc directly: a first fragment opens a datagram if
//! there is room (table and zone, after reclaiming every expired datagram), later fragments
//! follow it unless they overlap a byte already seen, contradict the datagram's end, exceed the
//! fragment budget or come after the timeout; a poisoned datagram drops everything until it
//! expires; a complete one is released. The proptest drives both through random sequences of
//! first and later fragments over a small key space with time advancing, and after every step
//! they must agree on the result, on `len` and on every counter (a full `expire` sweep frees
//! exactly the model's expired datagrams), and the table must pass
//! `check_invariants`. The table is small (16 entries) so the full and reclaim paths run often.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use spillway_vswitch::frag::{
    FragConfig, FragCounters, FragDrop, FragKey, FragPiece, FragTable, FragZone,
};
use spillway_vswitch::{Instant, PortId};
use spillway_wire::IpAddr16;

#[derive(Debug)]
struct ModelDatagram {
    deadline: Instant,
    poisoned: Option<FragDrop>,
    value: u32,
    fragments: usize,
    bytes: BTreeSet<u32>,
    total: Option<u32>,
}

impl ModelDatagram {
    fn record(&mut self, p: FragPiece) -> bool {
        let max_end = self.bytes.iter().next_back().map_or(0, |b| b + 1);
        let consistent = match (self.total, p.more) {
            (Some(t), _) if p.end > t => false,
            (Some(t), false) => p.end == t,
            (None, false) => p.end >= max_end,
            (_, true) => true,
        };
        if !consistent || p.end <= p.start || (p.start..p.end).any(|b| self.bytes.contains(&b)) {
            return false;
        }
        self.bytes.extend(p.start..p.end);
        if !p.more {
            self.total = Some(p.end);
        }
        true
    }

    fn complete(&self) -> bool {
        self.total == Some(self.bytes.len() as u32)
    }
}

struct Model {
    cfg: FragConfig,
    map: BTreeMap<FragKey, ModelDatagram>,
    counters: FragCounters,
}

impl Model {
    fn reclaim(&mut self, now: Instant) {
        let before = self.map.len();
        self.map.retain(|_, d| d.deadline > now);
        self.counters.expired += (before - self.map.len()) as u64;
    }

    fn full(&self, zone: FragZone) -> bool {
        self.map.len() >= self.cfg.entries_max
            || self.map.keys().filter(|k| k.zone == zone).count() >= self.cfg.zone_entries_max
    }

    fn track_first(
        &mut self,
        now: Instant,
        key: FragKey,
        p: FragPiece,
        value: u32,
    ) -> Result<(), FragDrop> {
        if let Some(d) = self.map.get_mut(&key) {
            if d.deadline > now {
                let r = d.poisoned.unwrap_or(FragDrop::Overlap);
                d.poisoned = Some(r);
                return Err(r);
            }
            self.map.remove(&key);
            self.counters.expired += 1;
        }
        if self.full(key.zone) {
            self.reclaim(now);
        }
        if self.full(key.zone) {
            return Err(FragDrop::TableFull);
        }
        let mut d = ModelDatagram {
            deadline: now + self.cfg.timeout,
            poisoned: None,
            value,
            fragments: 1,
            bytes: BTreeSet::new(),
            total: None,
        };
        if !d.record(p) {
            return Err(FragDrop::Overlap);
        }
        self.counters.tracked += 1;
        if d.complete() {
            self.counters.completed += 1;
        } else {
            self.map.insert(key, d);
        }
        Ok(())
    }

    fn follow(&mut self, now: Instant, key: FragKey, p: FragPiece) -> Result<u32, FragDrop> {
        let max = self.cfg.fragments_max;
        let Some(d) = self.map.get_mut(&key) else {
            return Err(FragDrop::NoFirst);
        };
        if d.deadline <= now {
            self.map.remove(&key);
            self.counters.expired += 1;
            return Err(FragDrop::Timeout);
        }
        if let Some(r) = d.poisoned {
            return Err(r);
        }
        if d.fragments >= max {
            d.poisoned = Some(FragDrop::TooMany);
            return Err(FragDrop::TooMany);
        }
        if !d.record(p) {
            d.poisoned = Some(FragDrop::Overlap);
            return Err(FragDrop::Overlap);
        }
        d.fragments += 1;
        let v = d.value;
        self.counters.followed += 1;
        if d.complete() {
            self.map.remove(&key);
            self.counters.completed += 1;
        }
        Ok(v)
    }
}

#[derive(Clone, Debug)]
enum Op {
    First {
        key: (u8, u8),
        len: u32,
        more: bool,
        value: u32,
    },
    Later {
        key: (u8, u8),
        start_units: u32,
        len: u32,
        more: bool,
    },
    Advance(u64),
    /// `FragTable::expire` over every slot: afterwards nothing expired is held.
    Sweep,
}

fn key(k: (u8, u8)) -> FragKey {
    FragKey {
        zone: FragZone {
            port: PortId(u32::from(k.0)),
            vni: None,
        },
        src: IpAddr16::from_v4([10, 0, 0, 1]),
        dst: IpAddr16::from_v4([10, 0, 0, 2]),
        proto: 17,
        id: u32::from(k.1),
    }
}

fn op() -> impl Strategy<Value = Op> {
    let k = (0u8..3, 0u8..8);
    prop_oneof![
        3 => (k.clone(), 0u32..40, prop::bool::weighted(0.9), any::<u32>())
            .prop_map(|(key, len, more, value)| Op::First { key, len, more, value }),
        6 => (k, 0u32..10, 0u32..40, any::<bool>()).prop_map(|(key, start_units, len, more)| {
            Op::Later { key, start_units, len, more }
        }),
        1 => (0u64..1500).prop_map(Op::Advance),
        1 => Just(Op::Sweep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn frag_table_agrees_with_the_model(
        zone_max in 1usize..=16,
        fragments_max in 2usize..=8,
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let cfg = FragConfig {
            entries_max: 16,
            zone_entries_max: zone_max,
            fragments_max,
            timeout: Duration::from_secs(2),
            ..FragConfig::default()
        };
        let mut t: FragTable<u32> = FragTable::new(cfg).expect("valid config");
        let mut m = Model { cfg, map: BTreeMap::new(), counters: FragCounters::default() };
        let mut now = Instant(1);
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::First { key: k, len, more, value } => {
                    let p = FragPiece { start: 0, end: len, more };
                    let got = t.track_first(now, key(k), p, value);
                    let want = m.track_first(now, key(k), p, value);
                    prop_assert_eq!(got, want, "step {}: first {:?}", i, p);
                }
                Op::Later { key: k, start_units, len, more } => {
                    let start = start_units * 8;
                    let p = FragPiece { start, end: start + len, more };
                    let got = t.follow(now, key(k), p);
                    let want = m.follow(now, key(k), p);
                    prop_assert_eq!(got, want, "step {}: later {:?}", i, p);
                }
                Op::Advance(ms) => now = Instant(now.0 + ms * 1_000_000),
                Op::Sweep => {
                    let before = m.map.len();
                    m.reclaim(now);
                    // Two half sweeps: the cursor carries over between calls.
                    let freed = t.expire(now, 8) + t.expire(now, 8);
                    prop_assert_eq!(freed, before - m.map.len(), "step {}: swept", i);
                }
            }
            t.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(t.len(), m.map.len(), "step {}: len", i);
            prop_assert_eq!(t.counters(), m.counters, "step {}: counters", i);
        }
    }
}

#[test]
fn config_ranges_are_enforced() {
    let bad = [
        FragConfig {
            entries_max: 8,
            ..FragConfig::default()
        },
        FragConfig {
            zone_entries_max: 0,
            ..FragConfig::default()
        },
        FragConfig {
            zone_entries_max: 2048,
            ..FragConfig::default()
        },
        FragConfig {
            fragments_max: 65,
            ..FragConfig::default()
        },
        FragConfig {
            timeout: Duration::from_millis(10),
            ..FragConfig::default()
        },
    ];
    for cfg in bad {
        assert!(FragTable::<u32>::new(cfg).is_err(), "{cfg:?}");
    }
    assert!(FragTable::<u32>::new(FragConfig::default()).is_ok());
}

#[test]
fn fragments_in_any_order_after_the_first_complete_the_datagram() {
    let mut t: FragTable<u32> = FragTable::new(FragConfig::default()).expect("valid");
    let k = key((0, 0));
    let now = Instant(1);
    t.track_first(
        now,
        k,
        FragPiece {
            start: 0,
            end: 16,
            more: true,
        },
        7,
    )
    .expect("room");
    let last = FragPiece {
        start: 32,
        end: 40,
        more: false,
    };
    assert_eq!(t.follow(now, k, last), Ok(7));
    assert_eq!(t.len(), 1, "a hole remains");
    let mid = FragPiece {
        start: 16,
        end: 32,
        more: true,
    };
    assert_eq!(t.follow(now, k, mid), Ok(7));
    assert!(t.is_empty(), "complete datagrams are released");
    assert_eq!(t.counters().completed, 1);
    t.check_invariants().expect("invariants hold");
}
