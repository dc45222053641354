//! Differential test of the vATC against a byte-level reference model: proptest drives arbitrary
//! sequences of `map`, `unmap`, `remove_vm`, `fill`, `translate`, `invalidate`, `invalidate_vm`
//! and `invalidate_all` over three VMs and a small IOVA space, through a `RegionTable` + `Atc`
//! and through a reference (a `BTreeMap` of each VM's regions, checked by linear scan). It proves
//! that (1) the authority accepts, rejects and removes exactly what the reference does; (2) every
//! translation that succeeds covers exactly the asked range with contiguous segments, each inside
//! a region of *that* VM currently mapped with the needed permission, at `region.host + offset`,
//! so nothing stale or foreign is ever returned; (3) every translate outcome (miss ranges,
//! permission denial, segment overflow, hit) equals what a per-byte walk over the cache's fresh
//! entries predicts, so a miss names exactly the uncovered sub-ranges; (4) filling exactly the
//! reported ranges makes the retry succeed if and only if the reference says the whole range is
//! mapped with the permission (unless the fill had to evict); and (5) both structures keep
//! their invariants and every fresh cache entry is a current region, after every step. A
//! counting global allocator (per thread, so the harness cannot disturb it) also proves that a
//! translate hit allocates nothing.

use proptest::prelude::*;
use spillway_fabric::atc::{
    Atc, AtcConfig, AtcEntry, AtcError, HostAddr, Iova, IovaRange, MISS_RANGES_MAX, Mapping, Perm,
    RegionTable, SEGMENTS_MAX, Translation, VmId,
};
use std::collections::BTreeMap;

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

use spillway_testkit::allocations;

const VMS: u32 = 3;
const SPACE: u64 = 32;

#[derive(Clone, Debug)]
enum Op {
    Map {
        vm: u32,
        iova: u64,
        len: u64,
        host: u64,
        perm: Perm,
    },
    Unmap {
        vm: u32,
        iova: u64,
        len: u64,
    },
    RemoveVm {
        vm: u32,
    },
    Fill {
        vm: u32,
        iova: u64,
        len: u64,
    },
    /// Several adjacent regions of `len` bytes from `iova` (each mapped like `Map`).
    MapRun {
        vm: u32,
        iova: u64,
        count: u64,
        len: u64,
        host: u64,
        perm: Perm,
    },
    Translate {
        vm: u32,
        iova: u64,
        len: u64,
        need: Perm,
    },
    /// A translate starting inside the VM's `pick`-th region (modulo their number), `off` bytes
    /// in, so translations often hit mapped memory.
    TranslateMapped {
        vm: u32,
        pick: usize,
        off: u64,
        len: u64,
        need: Perm,
    },
    Invalidate {
        vm: u32,
        iova: u64,
        len: u64,
    },
    InvalidateVm {
        vm: u32,
    },
    InvalidateAll,
}

/// Region permissions: mostly read-write, sometimes less.
fn perm() -> impl Strategy<Value = Perm> {
    prop_oneof![6 => Just(Perm::RW), 1 => Just(Perm::READ), 1 => Just(Perm::WRITE), 1 => Just(Perm::NONE)]
}

/// Needed access: mostly write (the spill plane's receive buffers).
fn need() -> impl Strategy<Value = Perm> {
    prop_oneof![6 => Just(Perm::WRITE), 1 => Just(Perm::READ), 1 => Just(Perm::RW), 1 => Just(Perm::NONE)]
}

fn op() -> impl Strategy<Value = Op> {
    let vm = 0..VMS;
    let iova = 0..SPACE;
    // Small regions in a small space, so ranges often span several regions and the authority
    // fills up enough for hits; lengths of zero now and then for the error paths.
    let region_len = prop_oneof![1 => Just(0u64), 20 => 1..8u64];
    let len = prop_oneof![1 => Just(0u64), 20 => 1..16u64];
    prop_oneof![
        10 => (vm.clone(), iova.clone(), region_len, 0..256u64, perm())
            .prop_map(|(vm, iova, len, host, perm)| Op::Map { vm, iova, len, host, perm }),
        2 => (vm.clone(), iova.clone(), len.clone())
            .prop_map(|(vm, iova, len)| Op::Unmap { vm, iova, len }),
        1 => vm.clone().prop_map(|vm| Op::RemoveVm { vm }),
        3 => (vm.clone(), iova.clone(), len.clone())
            .prop_map(|(vm, iova, len)| Op::Fill { vm, iova, len }),
        3 => (vm.clone(), iova.clone(), 1..6u64, 1..5u64, 0..256u64, perm())
            .prop_map(|(vm, iova, count, len, host, perm)| Op::MapRun { vm, iova, count, len, host, perm }),
        5 => (vm.clone(), iova.clone(), len.clone(), need())
            .prop_map(|(vm, iova, len, need)| Op::Translate { vm, iova, len, need }),
        10 => (vm.clone(), 0..8usize, 0..8u64, 1..8u64, need())
            .prop_map(|(vm, pick, off, len, need)| Op::TranslateMapped { vm, pick, off, len, need }),
        2 => (vm.clone(), iova.clone(), len)
            .prop_map(|(vm, iova, len)| Op::Invalidate { vm, iova, len }),
        1 => vm.prop_map(|vm| Op::InvalidateVm { vm }),
        1 => Just(Op::InvalidateAll),
    ]
}

/// The reference authority: each VM's regions by start.
#[derive(Default)]
struct Reference {
    regions: BTreeMap<u32, BTreeMap<u64, Mapping>>,
}

fn intersects(m: &Mapping, iova: u64, len: u64) -> bool {
    m.iova.0 < iova + len && iova < m.iova.0 + m.len
}

impl Reference {
    fn of(&self, vm: u32) -> impl Iterator<Item = &Mapping> {
        self.regions.get(&vm).into_iter().flat_map(|r| r.values())
    }

    /// The region of `vm` containing byte `b`.
    fn at(&self, vm: u32, b: u64) -> Option<&Mapping> {
        self.of(vm).find(|m| intersects(m, b, 1))
    }
}

/// Each VM's host addresses live in their own window, so a translation leaking another VM's
/// memory would also fail the host-range check.
fn host_of(vm: u32, host: u64) -> HostAddr {
    HostAddr(u64::from(vm) << 32 | host)
}

/// Maximal runs of `[iova, end)` whose bytes fail `covered`, ascending.
fn runs(iova: u64, end: u64, covered: impl Fn(u64) -> bool) -> Vec<IovaRange> {
    let mut out: Vec<IovaRange> = Vec::new();
    for b in iova..end {
        if covered(b) {
            continue;
        }
        match out.last_mut() {
            Some(r) if r.start.0 + r.len == b => r.len += 1,
            _ => out.push(IovaRange {
                start: Iova(b),
                len: 1,
            }),
        }
    }
    out
}

/// What `translate` must answer when `fresh` entries cover the whole range (no miss): the
/// first denying entry, else too many segments, else one segment per entry touched.
fn predict(
    fresh: &[AtcEntry],
    vm: VmId,
    iova: u64,
    len: u64,
    need: Perm,
) -> Result<Vec<(u64, u64, u64)>, AtcError> {
    let end = iova + len;
    let touched: Vec<&AtcEntry> = fresh
        .iter()
        .filter(|e| intersects(&e.mapping, iova, len))
        .collect();
    for e in &touched {
        if !e.mapping.perm.allows(need) {
            let from = iova.max(e.mapping.iova.0);
            let to = end.min(e.mapping.iova.0 + e.mapping.len);
            return Err(AtcError::Permission {
                vm,
                range: IovaRange {
                    start: Iova(from),
                    len: to - from,
                },
                have: e.mapping.perm,
                need,
            });
        }
    }
    if touched.len() > SEGMENTS_MAX {
        return Err(AtcError::TooManySegments {
            vm,
            range: IovaRange {
                start: Iova(iova),
                len,
            },
            segments_max: SEGMENTS_MAX,
        });
    }
    Ok(touched
        .iter()
        .map(|e| {
            let from = iova.max(e.mapping.iova.0);
            let to = end.min(e.mapping.iova.0 + e.mapping.len);
            (
                from,
                e.mapping.host.0 + (from - e.mapping.iova.0),
                to - from,
            )
        })
        .collect())
}

/// The reported miss ranges for `gaps`: exact up to `MISS_RANGES_MAX`, then the last stretched.
fn reported(gaps: &[IovaRange], end: u64) -> Vec<IovaRange> {
    let mut out: Vec<IovaRange> = gaps.iter().copied().take(MISS_RANGES_MAX).collect();
    if gaps.len() > MISS_RANGES_MAX {
        let last = out.last_mut().expect("MISS_RANGES_MAX > 0");
        last.len = end - last.start.0;
    }
    out
}

struct Harness {
    table: RegionTable,
    atc: Atc,
    reference: Reference,
    translates: u64,
}

impl Harness {
    fn fresh(&self, vm: VmId) -> Vec<AtcEntry> {
        let epoch = self.table.epoch(vm);
        self.atc
            .entries(vm)
            .filter(|e| e.epoch == epoch)
            .copied()
            .collect()
    }

    /// Checks a successful translation against the reference authority.
    fn check_translation(&self, vm: u32, iova: u64, len: u64, need: Perm, t: &Translation) {
        let mut cursor = iova;
        for s in t.segments() {
            assert_eq!(s.iova.0, cursor, "segments are contiguous from the start");
            assert!(s.len > 0);
            let m = self
                .reference
                .at(vm, s.iova.0)
                .expect("segment lies in a region of that VM");
            assert!(
                s.iova.0 + s.len <= m.iova.0 + m.len,
                "segment within one region"
            );
            assert!(m.perm.allows(need), "region grants the needed access");
            assert_eq!(
                s.host.0,
                m.host.0 + (s.iova.0 - m.iova.0),
                "host = region.host + offset"
            );
            cursor += s.len;
        }
        assert_eq!(cursor, iova + len, "segments cover exactly the asked range");
        assert_eq!(t.len(), len);
    }

    /// Translates and checks the outcome against the per-byte prediction; returns it.
    fn translate(
        &mut self,
        vm: u32,
        iova: u64,
        len: u64,
        need: Perm,
    ) -> Result<Translation, AtcError> {
        let v = VmId(vm);
        let fresh = self.fresh(v);
        self.translates += 1;
        let got = self.atc.translate(&self.table, v, Iova(iova), len, need);
        if len == 0 {
            assert!(matches!(got, Err(AtcError::ZeroLength { .. })), "{got:?}");
            return got;
        }
        let end = iova + len;
        let gaps = runs(iova, end, |b| {
            fresh.iter().any(|e| intersects(&e.mapping, b, 1))
        });
        match &got {
            Err(AtcError::Miss(m)) => {
                assert!(!gaps.is_empty(), "a miss only when something is uncovered");
                assert_eq!(m.vm, v);
                assert_eq!(m.missing(), reported(&gaps, end).as_slice());
                assert_eq!(m.exact(), gaps.len() <= MISS_RANGES_MAX);
            }
            other => {
                assert!(gaps.is_empty(), "uncovered {gaps:?} but got {other:?}");
                let want = predict(&fresh, v, iova, len, need);
                match (other, want) {
                    (Ok(t), Ok(segs)) => {
                        let got: Vec<(u64, u64, u64)> = t
                            .segments()
                            .iter()
                            .map(|s| (s.iova.0, s.host.0, s.len))
                            .collect();
                        assert_eq!(got, segs);
                        self.check_translation(vm, iova, len, need, t);
                    }
                    (Err(e), Err(w)) => assert_eq!(*e, w),
                    (o, w) => panic!("got {o:?}, predicted {w:?}"),
                }
            }
        }
        got
    }

    /// Whether the reference maps all of `[iova, iova + len)` for `vm` with `need`, and in how
    /// many regions.
    fn mapped(&self, vm: u32, iova: u64, len: u64, need: Perm) -> Option<usize> {
        let end = iova + len;
        let ok = (iova..end).all(|b| {
            self.reference
                .at(vm, b)
                .is_some_and(|m| m.perm.allows(need))
        });
        ok.then(|| {
            self.reference
                .of(vm)
                .filter(|m| intersects(m, iova, len))
                .count()
        })
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Map {
                vm,
                iova,
                len,
                host,
                perm,
            } => {
                let m = Mapping {
                    iova: Iova(iova),
                    len,
                    host: host_of(vm, host),
                    perm,
                };
                let before = self.table.epoch(VmId(vm));
                let got = self.table.map(VmId(vm), m);
                let want = if len == 0 {
                    Err(AtcError::ZeroLength {
                        vm: VmId(vm),
                        iova: Iova(iova),
                    })
                } else if let Some(e) = self.reference.of(vm).find(|e| intersects(e, iova, len)) {
                    Err(AtcError::Overlap {
                        vm: VmId(vm),
                        new: m.range(),
                        existing: e.range(),
                    })
                } else {
                    self.reference
                        .regions
                        .entry(vm)
                        .or_default()
                        .insert(iova, m);
                    Ok(())
                };
                assert_eq!(got, want);
                assert_eq!(got.is_ok(), self.table.epoch(VmId(vm)) > before);
            }
            Op::Unmap { vm, iova, len } => {
                let got = self.table.unmap(VmId(vm), Iova(iova), len);
                if len == 0 {
                    assert!(got.is_err());
                    return;
                }
                let want: Vec<Mapping> = self
                    .reference
                    .of(vm)
                    .filter(|m| intersects(m, iova, len))
                    .copied()
                    .collect();
                if let Some(r) = self.reference.regions.get_mut(&vm) {
                    r.retain(|_, m| !intersects(m, iova, len));
                }
                assert_eq!(got.expect("valid range"), want);
            }
            Op::RemoveVm { vm } => {
                let got = self.table.remove_vm(VmId(vm));
                let want: Vec<Mapping> = self
                    .reference
                    .regions
                    .remove(&vm)
                    .unwrap_or_default()
                    .into_values()
                    .collect();
                assert_eq!(got, want);
            }
            Op::Fill { vm, iova, len } => {
                let got = self.atc.fill(&self.table, VmId(vm), Iova(iova), len);
                if len == 0 {
                    assert!(got.is_err());
                } else {
                    let want = self
                        .reference
                        .of(vm)
                        .filter(|m| intersects(m, iova, len))
                        .count();
                    assert_eq!(got, Ok(want));
                }
            }
            Op::MapRun {
                vm,
                iova,
                count,
                len,
                host,
                perm,
            } => {
                for i in 0..count {
                    self.step(&Op::Map {
                        vm,
                        iova: iova + i * len,
                        len,
                        host: host + i * len,
                        perm,
                    });
                }
            }
            Op::TranslateMapped {
                vm,
                pick,
                off,
                len,
                need,
            } => {
                let regions: Vec<Mapping> = self.reference.of(vm).copied().collect();
                if let Some(m) = regions.get(pick % regions.len().max(1)) {
                    let iova = m.iova.0 + off % m.len;
                    self.step(&Op::Translate {
                        vm,
                        iova,
                        len,
                        need,
                    });
                }
            }
            Op::Translate {
                vm,
                iova,
                len,
                need,
            } => {
                let Err(AtcError::Miss(miss)) = self.translate(vm, iova, len, need) else {
                    return;
                };
                // Resolve exactly the reported ranges, then retry.
                let evict_before = self.atc.counters().evict;
                for r in miss.missing() {
                    self.atc
                        .fill(&self.table, VmId(vm), r.start, r.len)
                        .expect("miss ranges are valid");
                }
                let evicted = self.atc.counters().evict > evict_before;
                let retry = self.translate(vm, iova, len, need);
                let want_ok = self
                    .mapped(vm, iova, len, need)
                    .is_some_and(|n| n <= SEGMENTS_MAX);
                if want_ok {
                    assert!(retry.is_ok() || evicted, "fill did not resolve: {retry:?}");
                } else {
                    assert!(retry.is_err(), "translated a range the reference refuses");
                }
                if !evicted {
                    let end = iova + len;
                    let unmapped = runs(iova, end, |b| self.reference.at(vm, b).is_some());
                    if unmapped.is_empty() {
                        assert!(!matches!(retry, Err(AtcError::Miss(_))), "{retry:?}");
                    } else if let Err(AtcError::Miss(m)) = retry {
                        assert_eq!(m.missing(), reported(&unmapped, end).as_slice());
                    } else {
                        panic!("unmapped {unmapped:?} but retry gave {retry:?}");
                    }
                }
            }
            Op::Invalidate { vm, iova, len } => {
                let v = VmId(vm);
                let want = if len == 0 {
                    None
                } else {
                    Some(
                        self.atc
                            .entries(v)
                            .filter(|e| intersects(&e.mapping, iova, len))
                            .count(),
                    )
                };
                let got = self.atc.invalidate(v, Iova(iova), len);
                assert_eq!(got.ok(), want);
                assert!(
                    self.atc
                        .entries(v)
                        .all(|e| len == 0 || !intersects(&e.mapping, iova, len))
                );
            }
            Op::InvalidateVm { vm } => {
                let want = self.atc.entries(VmId(vm)).count();
                assert_eq!(self.atc.invalidate_vm(VmId(vm)), want);
                assert_eq!(self.atc.entries(VmId(vm)).count(), 0);
            }
            Op::InvalidateAll => {
                let want = self.atc.len();
                assert_eq!(self.atc.invalidate_all(), want);
                assert!(self.atc.is_empty());
            }
        }
    }

    fn check(&self) {
        self.table.check_invariants().expect("table invariants");
        self.atc.check_invariants().expect("atc invariants");
        for vm in 0..VMS {
            let want: Vec<Mapping> = self.reference.of(vm).copied().collect();
            let got: Vec<Mapping> = self.table.regions(VmId(vm)).copied().collect();
            assert_eq!(got, want);
            // Never stale: an entry at the VM's current epoch is exactly a current region.
            for e in self.fresh(VmId(vm)) {
                assert_eq!(e.vm, VmId(vm));
                assert!(
                    want.contains(&e.mapping),
                    "fresh entry {e:?} is not current"
                );
            }
        }
        let c = self.atc.counters();
        assert_eq!(
            c.hit + c.miss + c.perm_denied + c.segments_exceeded + c.invalid,
            self.translates,
            "every translate has exactly one outcome"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn atc_matches_reference(
        entries_max in 1usize..16,
        ops in prop::collection::vec(op(), 1..64),
    ) {
        let mut h = Harness {
            table: RegionTable::new(),
            atc: Atc::new(AtcConfig { entries_max }).expect("entries_max >= 1"),
            reference: Reference::default(),
            translates: 0,
        };
        for op in &ops {
            h.step(op);
            h.check();
        }
    }
}

#[test]
fn translate_hit_does_not_allocate() {
    let mut table = RegionTable::new();
    let vm = VmId(1);
    for i in 0..64u64 {
        let m = Mapping {
            iova: Iova(i * 0x1000),
            len: 0x1000,
            host: HostAddr(0x10_0000 + i * 0x1000),
            perm: Perm::RW,
        };
        table.map(vm, m).expect("disjoint regions");
    }
    let mut atc = Atc::new(AtcConfig { entries_max: 64 }).expect("entries_max >= 1");
    atc.fill(&table, vm, Iova(0), 64 * 0x1000)
        .expect("valid range");
    let before = allocations();
    let mut bytes = 0;
    for round in 0..10_000u64 {
        // Buffers straddling up to three regions, all over the cached range.
        let iova = Iova((round * 0x7a3) % (60 * 0x1000));
        let t = atc
            .translate(&table, vm, iova, 0x2000, Perm::WRITE)
            .expect("cached, writable, at most 3 regions");
        bytes += t.len();
    }
    assert_eq!(allocations(), before, "translate hits allocated");
    assert_eq!(bytes, 10_000 * 0x2000);
    assert_eq!(atc.counters().hit, 10_000);
}
