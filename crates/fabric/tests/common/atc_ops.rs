//! Operation sequences for the vATC, decoded from arbitrary bytes and checked against a reference
//! model after every step. Shared by the `atc_ops` fuzz target (`fuzz/fuzz_targets/atc_ops.rs`
//! includes this file by `#[path]`) and by `tests/atc_fuzz_regressions.rs`, so a crasher the
//! fuzzer finds replays under plain `cargo test` through exactly the same code.
//!
//! ## Input format
//!
//! Byte 0 picks the cache capacity (`entries_max = 1 + b % 16`). Then a sequence of records, each
//! an opcode byte followed by a fixed number of argument bytes (see [`decode`]); a record cut
//! short ends the input. Every byte string decodes to some sequence, so decoding never panics.
//!
//! ## The reference
//!
//! [`Model`] keeps, per VM, the authority's regions and the regions the cache must hold *fresh*:
//! filled since the VM's last successful `map`/`unmap`/`remove_vm` and not invalidated since.
//! The only thing it cannot predict is which entry LRU eviction picks, so after a `fill` it
//! drops whatever fresh entries the cache no longer shows, and checks that no more went missing
//! than the `atc.evict` counter says. After every step the cache's fresh entries (those at the
//! VM's current epoch) must be exactly the model's, so every translate outcome is predictable by
//! a per-byte walk over the model: the miss ranges, the denying region, the segment overflow or
//! the exact segments. Each segment of a hit is also checked against the authority alone: inside
//! a region currently mapped to *that* VM, with the needed permission, at `host + offset`, inside
//! the VM's own host window (the windows are disjoint, so a write into another VM's memory would
//! be caught even if the model and the cache agreed on it).

use spillway_fabric::atc::{
    Atc, AtcConfig, AtcCounters, AtcEpoch, AtcError, HostAddr, Iova, IovaRange, MISS_RANGES_MAX,
    Mapping, Perm, RegionTable, SEGMENTS_MAX, Translation, VmId,
};
use std::collections::BTreeMap;

/// VMs the operations address (`VmId(0)..VmId(VMS)`).
pub const VMS: u32 = 3;
/// Bytes of IOVA space at the bottom the small addresses fall in.
const LOW_SPACE: u64 = 48;
/// Bytes of IOVA space at the top of `u64` that "high" addresses fall in (overflow edges).
const HIGH_SPACE: u64 = 64;
/// Width of each VM's host window.
const WINDOW: u64 = 1 << 40;

/// One operation on the authority or the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `RegionTable::map` of one region; `host` is an offset in the VM's window.
    Map {
        vm: u32,
        iova: u64,
        len: u64,
        host: u64,
        perm: Perm,
    },
    /// `count` regions of `len` bytes from `iova`, `gap` bytes apart (each like `Map`): dense
    /// runs for multi-segment hits, gapped ones for miss lists longer than `MISS_RANGES_MAX`.
    MapRun {
        vm: u32,
        iova: u64,
        count: u64,
        len: u64,
        gap: u64,
        host: u64,
        perm: Perm,
    },
    /// A map whose host address is `u64::MAX - back` with `back < len`: must fail (host overflow,
    /// or an earlier error), never land outside the VM's window.
    MapHostOverflow {
        vm: u32,
        iova: u64,
        len: u64,
        back: u64,
    },
    /// `RegionTable::unmap`.
    Unmap { vm: u32, iova: u64, len: u64 },
    /// `RegionTable::remove_vm`.
    RemoveVm { vm: u32 },
    /// `Atc::fill`.
    Fill { vm: u32, iova: u64, len: u64 },
    /// `Atc::translate`.
    Translate {
        vm: u32,
        iova: u64,
        len: u64,
        need: Perm,
    },
    /// A translate starting `off` bytes into the VM's `pick`-th region (modulo their number), so
    /// translations often touch mapped memory; with `resolve`, run the miss loop like `Resolve`.
    TranslateMapped {
        vm: u32,
        pick: usize,
        off: u64,
        len: u64,
        need: Perm,
        resolve: bool,
    },
    /// The documented miss loop: translate, fill exactly the reported ranges, translate again.
    Resolve {
        vm: u32,
        iova: u64,
        len: u64,
        need: Perm,
    },
    /// `Atc::invalidate`.
    Invalidate { vm: u32, iova: u64, len: u64 },
    /// `Atc::invalidate_vm`.
    InvalidateVm { vm: u32 },
    /// `Atc::invalidate_all`.
    InvalidateAll,
}

/// A decoded input: the cache capacity and the operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// `AtcConfig::entries_max`.
    pub entries_max: usize,
    /// The operations, in order.
    pub ops: Vec<Op>,
}

/// How often each outcome occurred (so tests can show the inputs reach every path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Translations that hit.
    pub hit: u64,
    /// Translations that missed with an exact list.
    pub miss_exact: u64,
    /// Translations that missed with more gaps than `MISS_RANGES_MAX` (last range stretched).
    pub miss_stretched: u64,
    /// Translations denied for permission.
    pub permission: u64,
    /// Translations that spanned too many regions.
    pub too_many_segments: u64,
    /// Translations refused for a zero-length or overflowing range.
    pub invalid: u64,
    /// Fresh entries the model saw evicted.
    pub evicted_fresh: u64,
    /// The cache's `atc.stale` counter at the end.
    pub stale: u64,
    /// Successful maps.
    pub mapped: u64,
}

impl Outcomes {
    /// Adds `other` to `self`.
    pub fn add(&mut self, other: &Outcomes) {
        self.hit += other.hit;
        self.miss_exact += other.miss_exact;
        self.miss_stretched += other.miss_stretched;
        self.permission += other.permission;
        self.too_many_segments += other.too_many_segments;
        self.invalid += other.invalid;
        self.evicted_fresh += other.evicted_fresh;
        self.stale += other.stale;
        self.mapped += other.mapped;
    }
}

/// Reads fixed-size records; `None` once the input runs out.
struct Reader<'a> {
    rest: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, tail) = self.rest.split_first_chunk::<N>()?;
        self.rest = tail;
        Some(*head)
    }
}

fn vm(b: u8) -> u32 {
    u32::from(b) % VMS
}

/// An IOVA: mostly in the small space at the bottom, a quarter in the top 64 bytes of `u64`.
fn iova(b: u8) -> u64 {
    if b >= 0xc0 {
        u64::MAX - u64::from(b) % HIGH_SPACE
    } else {
        u64::from(b) % LOW_SPACE
    }
}

/// A region length, 0 (an error) to 8.
fn region_len(b: u8) -> u64 {
    u64::from(b) % 9
}

/// A translate length: 0 (an error) to 8 half the time, else 9 to 32, long enough to span more
/// than `SEGMENTS_MAX` regions or leave more than `MISS_RANGES_MAX` gaps.
fn translate_len(b: u8) -> u64 {
    if b >= 0x80 {
        9 + u64::from(b) % 24
    } else {
        u64::from(b) % 9
    }
}

/// A length for unmap/fill/invalidate: small most of the time, else `u64::MAX >> k` (the whole
/// space, or an overflow).
fn range_len(b: u8) -> u64 {
    if b >= 0xc0 {
        u64::MAX >> (b & 0x3f)
    } else {
        u64::from(b) % 20
    }
}

/// A region permission.
fn perm(b: u8) -> Perm {
    [Perm::RW, Perm::RW, Perm::READ, Perm::WRITE, Perm::NONE][usize::from(b) % 5]
}

/// A needed access.
fn need(b: u8) -> Perm {
    [Perm::WRITE, Perm::WRITE, Perm::READ, Perm::RW, Perm::NONE][usize::from(b) % 5]
}

/// Decodes arbitrary bytes. Records are an opcode byte (`% 16`, so some operations get two
/// codes: maps, fills and translations are the common case, wiping a whole VM the rare one),
/// then its argument bytes:
///
/// | code | op | args |
/// |---|---|---|
/// | 0, 1 | `Map` | vm, iova, len, host, perm |
/// | 2 | `MapRun` | vm, iova, count and gap, len, host, perm |
/// | 3 | `MapHostOverflow` | vm, iova, len, back |
/// | 4 | `Unmap` | vm, iova, len |
/// | 5, 6 | `Fill` | vm, iova, len |
/// | 7 | `Translate` | vm, iova, len, need |
/// | 8, 9 | `TranslateMapped` | vm, pick (top bit: resolve), off, len, need |
/// | 10 | `Resolve` | vm, iova, len, need |
/// | 11 | `Invalidate` | vm, iova, len |
/// | 12 | `RemoveVm` | vm |
/// | 13 | `InvalidateVm` | vm |
/// | 14 | `InvalidateAll` | |
/// | 15 | `Map` | vm, iova, len, host, perm |
pub fn decode(data: &[u8]) -> Input {
    let mut r = Reader { rest: data };
    let entries_max = r.take::<1>().map_or(4, |[b]| 1 + usize::from(b) % 16);
    let mut ops = Vec::new();
    while let Some([code]) = r.take::<1>() {
        let op = match code % 16 {
            0 | 1 | 15 => r.take::<5>().map(|[v, i, l, h, p]| Op::Map {
                vm: vm(v),
                iova: iova(i),
                len: region_len(l),
                host: u64::from(h) * 16,
                perm: perm(p),
            }),
            2 => r.take::<6>().map(|[v, i, c, l, h, p]| Op::MapRun {
                vm: vm(v),
                iova: iova(i),
                count: 1 + u64::from(c) % 6,
                len: 1 + u64::from(l) % 4,
                gap: u64::from(c / 6) % 3,
                host: u64::from(h) * 16,
                perm: perm(p),
            }),
            3 => r.take::<4>().map(|[v, i, l, k]| {
                let len = 1 + region_len(l);
                Op::MapHostOverflow {
                    vm: vm(v),
                    iova: iova(i),
                    len,
                    back: u64::from(k) % len,
                }
            }),
            4 => r.take::<3>().map(|[v, i, l]| Op::Unmap {
                vm: vm(v),
                iova: iova(i),
                len: range_len(l),
            }),
            5 | 6 => r.take::<3>().map(|[v, i, l]| Op::Fill {
                vm: vm(v),
                iova: iova(i),
                len: range_len(l),
            }),
            7 => r.take::<4>().map(|[v, i, l, n]| Op::Translate {
                vm: vm(v),
                iova: iova(i),
                len: translate_len(l),
                need: need(n),
            }),
            8 | 9 => r.take::<5>().map(|[v, p, o, l, n]| Op::TranslateMapped {
                vm: vm(v),
                pick: usize::from(p & 0x7f),
                off: u64::from(o),
                len: translate_len(l),
                need: need(n),
                resolve: p & 0x80 != 0,
            }),
            10 => r.take::<4>().map(|[v, i, l, n]| Op::Resolve {
                vm: vm(v),
                iova: iova(i),
                len: translate_len(l),
                need: need(n),
            }),
            11 => r.take::<3>().map(|[v, i, l]| Op::Invalidate {
                vm: vm(v),
                iova: iova(i),
                len: range_len(l),
            }),
            12 => r.take::<1>().map(|[v]| Op::RemoveVm { vm: vm(v) }),
            13 => r.take::<1>().map(|[v]| Op::InvalidateVm { vm: vm(v) }),
            _ => Some(Op::InvalidateAll),
        };
        match op {
            Some(op) => ops.push(op),
            None => break,
        }
    }
    Input { entries_max, ops }
}

/// Runs `input` through a fresh `RegionTable` + `Atc` and the model, checking after every step;
/// panics on the first violated property.
pub fn run(input: &Input) -> Outcomes {
    let mut h = Harness {
        table: RegionTable::new(),
        atc: Atc::new(AtcConfig {
            entries_max: input.entries_max,
        })
        .expect("entries_max >= 1"),
        model: Model::default(),
        epochs: [AtcEpoch(0); VMS as usize],
        epoch_max: AtcEpoch(0),
        out: Outcomes::default(),
    };
    h.check(None);
    for (step, op) in input.ops.iter().enumerate() {
        h.step(step, op);
    }
    h.out.stale = h.atc.counters().stale;
    h.out
}

/// The host window of `vm`: `[(vm + 1) << 40, (vm + 2) << 40)`, disjoint from every other VM's.
fn window(vm: u32) -> (u64, u64) {
    let base = (u64::from(vm) + 1) * WINDOW;
    (base, base + WINDOW)
}

/// Whether `[a, a + alen)` and `[b, b + blen)` intersect (ends computed without overflow by the
/// callers' checks: both ranges here are valid).
fn intersects(m: &Mapping, iova: u64, end: u64) -> bool {
    m.iova.0 < end && iova < m.iova.0 + m.len
}

fn contains(m: &Mapping, b: u64) -> bool {
    m.iova.0 <= b && b - m.iova.0 < m.len
}

/// The range argument check every operation shares: zero length, then overflow.
fn range_error(vm: u32, iova: u64, len: u64) -> Result<u64, AtcError> {
    if len == 0 {
        return Err(AtcError::ZeroLength {
            vm: VmId(vm),
            iova: Iova(iova),
        });
    }
    iova.checked_add(len).ok_or(AtcError::IovaOverflow {
        vm: VmId(vm),
        iova: Iova(iova),
        len,
    })
}

/// The reported miss ranges for `gaps`: exact up to `MISS_RANGES_MAX`, then the last one
/// stretched to `end`.
fn reported(gaps: &[IovaRange], end: u64) -> Vec<IovaRange> {
    let mut out: Vec<IovaRange> = gaps.iter().copied().take(MISS_RANGES_MAX).collect();
    if gaps.len() > MISS_RANGES_MAX {
        let last = out.last_mut().expect("MISS_RANGES_MAX > 0");
        last.len = end - last.start.0;
    }
    out
}

/// The reference: per VM, the authority's regions and the cache's fresh regions, by start.
#[derive(Default)]
struct Model {
    regions: BTreeMap<u32, BTreeMap<u64, Mapping>>,
    cached: BTreeMap<u32, BTreeMap<u64, Mapping>>,
}

impl Model {
    fn regions(&self, vm: u32) -> impl Iterator<Item = &Mapping> {
        self.regions.get(&vm).into_iter().flat_map(|r| r.values())
    }

    fn cached(&self, vm: u32) -> impl Iterator<Item = &Mapping> {
        self.cached.get(&vm).into_iter().flat_map(|r| r.values())
    }

    /// The authority changed for `vm`: every cached entry of it is stale.
    fn authority_changed(&mut self, vm: u32) {
        self.cached.remove(&vm);
    }

    /// What `translate` must answer for a valid range, from the fresh entries alone: a per-byte
    /// walk finds the gaps; with none, the first denying entry, then the segment count.
    fn predict(&self, vm: u32, iova: u64, end: u64, need: Perm) -> Prediction {
        let mut gaps: Vec<IovaRange> = Vec::new();
        for b in iova..end {
            if self.cached(vm).any(|m| contains(m, b)) {
                continue;
            }
            match gaps.last_mut() {
                Some(r) if r.start.0 + r.len == b => r.len += 1,
                _ => gaps.push(IovaRange {
                    start: Iova(b),
                    len: 1,
                }),
            }
        }
        if !gaps.is_empty() {
            return Prediction::Miss {
                missing: reported(&gaps, end),
                exact: gaps.len() <= MISS_RANGES_MAX,
            };
        }
        let touched: Vec<&Mapping> = self
            .cached(vm)
            .filter(|m| intersects(m, iova, end))
            .collect();
        let part = |m: &Mapping| {
            let from = iova.max(m.iova.0);
            let to = end.min(m.iova.0 + m.len);
            (from, m.host.0 + (from - m.iova.0), to - from)
        };
        if let Some(m) = touched.iter().find(|m| !m.perm.allows(need)) {
            let (from, _, len) = part(m);
            return Prediction::Err(AtcError::Permission {
                vm: VmId(vm),
                range: IovaRange {
                    start: Iova(from),
                    len,
                },
                have: m.perm,
                need,
            });
        }
        if touched.len() > SEGMENTS_MAX {
            return Prediction::Err(AtcError::TooManySegments {
                vm: VmId(vm),
                range: IovaRange {
                    start: Iova(iova),
                    len: end - iova,
                },
                segments_max: SEGMENTS_MAX,
            });
        }
        Prediction::Hit(touched.into_iter().map(part).collect())
    }
}

#[derive(Debug)]
enum Prediction {
    /// `(iova, host, len)` per segment.
    Hit(Vec<(u64, u64, u64)>),
    Miss {
        missing: Vec<IovaRange>,
        exact: bool,
    },
    Err(AtcError),
}

struct Harness {
    table: RegionTable,
    atc: Atc,
    model: Model,
    /// Each VM's epoch after the last step.
    epochs: [AtcEpoch; VMS as usize],
    /// The largest epoch seen on any VM.
    epoch_max: AtcEpoch,
    out: Outcomes,
}

impl Harness {
    /// The cache's entries of `vm` at its current epoch, as mappings in IOVA order.
    fn fresh(&self, vm: u32) -> Vec<Mapping> {
        let epoch = self.table.epoch(VmId(vm));
        self.atc
            .entries(VmId(vm))
            .filter(|e| e.epoch == epoch)
            .map(|e| e.mapping)
            .collect()
    }

    fn step(&mut self, step: usize, op: &Op) {
        let changed = match *op {
            Op::Map {
                vm,
                iova,
                len,
                host,
                perm,
            } => {
                let host = window(vm).0 + host;
                self.map(vm, iova, len, host, perm)
            }
            Op::MapRun {
                vm,
                iova,
                count,
                len,
                gap,
                host,
                perm,
            } => {
                let mut changed = false;
                for i in 0..count {
                    let Some(at) = iova.checked_add(i * (len + gap)) else {
                        break;
                    };
                    let host = window(vm).0 + host + i * len;
                    changed |= self.map(vm, at, len, host, perm);
                    // Check between the maps too: each is a step of its own.
                    self.check(changed.then_some(vm));
                    self.sync_epochs();
                    changed = false;
                }
                false
            }
            Op::MapHostOverflow {
                vm,
                iova,
                len,
                back,
            } => {
                let changed = self.map(vm, iova, len, u64::MAX - back, Perm::RW);
                assert!(
                    !changed,
                    "step {step}: a map overflowing host space succeeded"
                );
                false
            }
            Op::Unmap { vm, iova, len } => self.unmap(vm, iova, len),
            Op::RemoveVm { vm } => {
                let got = self.table.remove_vm(VmId(vm));
                let want: Vec<Mapping> = self
                    .model
                    .regions
                    .remove(&vm)
                    .unwrap_or_default()
                    .into_values()
                    .collect();
                assert_eq!(got, want, "step {step}: remove_vm returns the VM's regions");
                if !want.is_empty() {
                    self.model.authority_changed(vm);
                }
                !want.is_empty()
            }
            Op::Fill { vm, iova, len } => {
                self.fill(vm, iova, len);
                false
            }
            Op::Translate {
                vm,
                iova,
                len,
                need,
            } => {
                // Checked inside; the outcome itself is of no further use here.
                let _ = self.translate(vm, iova, len, need);
                false
            }
            Op::TranslateMapped {
                vm,
                pick,
                off,
                len,
                need,
                resolve,
            } => {
                let regions: Vec<Mapping> = self.model.regions(vm).copied().collect();
                if let Some(m) = regions.get(pick % regions.len().max(1)) {
                    let iova = m.iova.0 + off % m.len;
                    if resolve {
                        self.resolve(vm, iova, len, need);
                    } else {
                        let _ = self.translate(vm, iova, len, need);
                    }
                }
                false
            }
            Op::Resolve {
                vm,
                iova,
                len,
                need,
            } => {
                self.resolve(vm, iova, len, need);
                false
            }
            Op::Invalidate { vm, iova, len } => {
                let v = VmId(vm);
                let want = range_error(vm, iova, len).map(|end| {
                    self.atc
                        .entries(v)
                        .filter(|e| intersects(&e.mapping, iova, end))
                        .count()
                });
                let got = self.atc.invalidate(v, Iova(iova), len);
                assert_eq!(got, want, "step {step}: invalidate drops what intersects");
                if let Ok(end) = range_error(vm, iova, len) {
                    if let Some(c) = self.model.cached.get_mut(&vm) {
                        c.retain(|_, m| !intersects(m, iova, end));
                    }
                    assert!(
                        self.atc
                            .entries(v)
                            .all(|e| !intersects(&e.mapping, iova, end)),
                        "step {step}: an invalidated entry survived"
                    );
                }
                false
            }
            Op::InvalidateVm { vm } => {
                let want = self.atc.entries(VmId(vm)).count();
                assert_eq!(self.atc.invalidate_vm(VmId(vm)), want, "step {step}");
                self.model.cached.remove(&vm);
                assert_eq!(self.atc.entries(VmId(vm)).count(), 0, "step {step}");
                false
            }
            Op::InvalidateAll => {
                let want = self.atc.len();
                assert_eq!(self.atc.invalidate_all(), want, "step {step}");
                self.model.cached.clear();
                assert!(self.atc.is_empty(), "step {step}");
                false
            }
        };
        let vm = match *op {
            Op::Map { vm, .. } | Op::Unmap { vm, .. } | Op::RemoveVm { vm } => Some(vm),
            _ => None,
        };
        self.check(vm.filter(|_| changed));
        self.sync_epochs();
    }

    /// Maps one region and checks the outcome against the model; returns whether it succeeded.
    fn map(&mut self, vm: u32, iova: u64, len: u64, host: u64, perm: Perm) -> bool {
        let m = Mapping {
            iova: Iova(iova),
            len,
            host: HostAddr(host),
            perm,
        };
        let want = range_error(vm, iova, len).and_then(|end| {
            if host.checked_add(len).is_none() {
                return Err(AtcError::HostOverflow {
                    vm: VmId(vm),
                    host: HostAddr(host),
                    len,
                });
            }
            match self.model.regions(vm).find(|e| intersects(e, iova, end)) {
                Some(e) => Err(AtcError::Overlap {
                    vm: VmId(vm),
                    new: m.range(),
                    existing: e.range(),
                }),
                None => Ok(()),
            }
        });
        let got = self.table.map(VmId(vm), m);
        assert_eq!(got, want, "map {m:?} of vm {vm}");
        if got.is_ok() {
            let (lo, hi) = window(vm);
            assert!(
                lo <= host && host + len <= hi,
                "model maps inside the window"
            );
            self.model.regions.entry(vm).or_default().insert(iova, m);
            self.model.authority_changed(vm);
            self.out.mapped += 1;
        }
        got.is_ok()
    }

    fn unmap(&mut self, vm: u32, iova: u64, len: u64) -> bool {
        let got = self.table.unmap(VmId(vm), Iova(iova), len);
        let end = match range_error(vm, iova, len) {
            Ok(end) => end,
            Err(e) => {
                assert_eq!(got, Err(e), "unmap of an invalid range");
                return false;
            }
        };
        let want: Vec<Mapping> = self
            .model
            .regions(vm)
            .filter(|m| intersects(m, iova, end))
            .copied()
            .collect();
        if let Some(r) = self.model.regions.get_mut(&vm) {
            r.retain(|_, m| !intersects(m, iova, end));
        }
        assert_eq!(got, Ok(want.clone()), "unmap returns whole regions hit");
        if !want.is_empty() {
            self.model.authority_changed(vm);
        }
        !want.is_empty()
    }

    fn fill(&mut self, vm: u32, iova: u64, len: u64) {
        let evict_before = self.atc.counters().evict;
        let got = self.atc.fill(&self.table, VmId(vm), Iova(iova), len);
        let end = match range_error(vm, iova, len) {
            Ok(end) => end,
            Err(e) => {
                assert_eq!(got, Err(e), "fill of an invalid range");
                return;
            }
        };
        let hit: Vec<Mapping> = self
            .model
            .regions(vm)
            .filter(|m| intersects(m, iova, end))
            .copied()
            .collect();
        assert_eq!(got, Ok(hit.len()), "fill caches every region it touches");
        let cached = self.model.cached.entry(vm).or_default();
        for m in &hit {
            cached.retain(|_, e| !intersects(e, m.iova.0, m.iova.0 + m.len));
            cached.insert(m.iova.0, *m);
        }
        // Eviction is the one choice the model leaves to the cache: forget what it evicted, but
        // never more than it counted.
        let evicted = self.atc.counters().evict - evict_before;
        let mut lost = 0;
        for v in 0..VMS {
            let fresh = self.fresh(v);
            if let Some(c) = self.model.cached.get_mut(&v) {
                let before = c.len();
                c.retain(|_, m| fresh.contains(m));
                lost += (before - c.len()) as u64;
            }
        }
        assert!(
            lost <= evicted,
            "fill lost {lost} fresh entries but counted {evicted} evictions"
        );
        self.out.evicted_fresh += lost;
    }

    /// Translates and checks the outcome against the model's prediction and the authority.
    fn translate(
        &mut self,
        vm: u32,
        iova: u64,
        len: u64,
        need: Perm,
    ) -> Result<Translation, AtcError> {
        let before = *self.atc.counters();
        let got = self
            .atc
            .translate(&self.table, VmId(vm), Iova(iova), len, need);
        let after = *self.atc.counters();
        let bumped = |f: fn(&AtcCounters) -> u64| f(&after) - f(&before);
        let outcome = [
            bumped(|c| c.hit),
            bumped(|c| c.miss),
            bumped(|c| c.perm_denied),
            bumped(|c| c.segments_exceeded),
            bumped(|c| c.invalid),
        ];
        let end = match range_error(vm, iova, len) {
            Ok(end) => end,
            Err(e) => {
                assert_eq!(got, Err(e), "translate of an invalid range");
                assert_eq!(outcome, [0, 0, 0, 0, 1], "counted as invalid");
                self.out.invalid += 1;
                return got;
            }
        };
        let want = self.model.predict(vm, iova, end, need);
        match (&got, &want) {
            (Ok(t), Prediction::Hit(segments)) => {
                let segs: Vec<(u64, u64, u64)> = t
                    .segments()
                    .iter()
                    .map(|s| (s.iova.0, s.host.0, s.len))
                    .collect();
                assert_eq!(&segs, segments, "hit segments for [{iova:#x}, {end:#x})");
                self.check_against_authority(vm, iova, end, need, t);
                assert_eq!(outcome, [1, 0, 0, 0, 0], "counted as a hit");
                self.out.hit += 1;
            }
            (Err(AtcError::Miss(m)), Prediction::Miss { missing, exact }) => {
                assert_eq!(m.vm, VmId(vm));
                assert_eq!(
                    m.range,
                    IovaRange {
                        start: Iova(iova),
                        len
                    }
                );
                assert_eq!(m.missing(), missing.as_slice(), "miss ranges");
                assert_eq!(m.exact(), *exact, "miss exactness");
                assert_eq!(outcome, [0, 1, 0, 0, 0], "counted as a miss");
                if *exact {
                    self.out.miss_exact += 1;
                } else {
                    self.out.miss_stretched += 1;
                }
            }
            (Err(e), Prediction::Err(w)) if e == w => {
                let want_outcome = match w {
                    AtcError::Permission { .. } => {
                        self.out.permission += 1;
                        [0, 0, 1, 0, 0]
                    }
                    _ => {
                        self.out.too_many_segments += 1;
                        [0, 0, 0, 1, 0]
                    }
                };
                assert_eq!(outcome, want_outcome, "counted once");
            }
            (got, want) => panic!(
                "translate vm {vm} [{iova:#x}, +{len}) {need:?}: got {got:?}, model predicts \
                 {want:?}; fresh model entries {:?}",
                self.model.cached(vm).collect::<Vec<_>>()
            ),
        }
        got
    }

    /// A hit judged by the authority alone: contiguous segments covering exactly the asked range,
    /// each inside one region currently mapped to `vm` that grants `need`, at the region's host
    /// offset, inside `vm`'s host window.
    fn check_against_authority(&self, vm: u32, iova: u64, end: u64, need: Perm, t: &Translation) {
        let (lo, hi) = window(vm);
        let mut cursor = iova;
        for s in t.segments() {
            assert_eq!(s.iova.0, cursor, "segments contiguous from the start");
            assert!(s.len > 0, "no empty segment");
            let m = self
                .model
                .regions(vm)
                .find(|m| contains(m, s.iova.0))
                .unwrap_or_else(|| panic!("segment {s:?} outside every region of vm {vm}"));
            assert!(
                s.iova.0 + s.len <= m.iova.0 + m.len,
                "segment {s:?} runs past its region {m:?}"
            );
            assert!(m.perm.allows(need), "region {m:?} denies {need:?}");
            assert_eq!(s.host.0, m.host.0 + (s.iova.0 - m.iova.0), "host offset");
            assert!(
                lo <= s.host.0 && s.host.0 + s.len <= hi,
                "segment {s:?} writes outside vm {vm}'s memory"
            );
            cursor += s.len;
        }
        assert_eq!(cursor, end, "segments cover exactly the asked range");
        assert_eq!(t.len(), end - iova);
    }

    /// Translate, fill exactly the reported ranges, retry: the retry must not miss when the
    /// authority maps the whole range and nothing was evicted on the way.
    fn resolve(&mut self, vm: u32, iova: u64, len: u64, need: Perm) {
        let Err(AtcError::Miss(miss)) = self.translate(vm, iova, len, need) else {
            return;
        };
        let evict_before = self.atc.counters().evict;
        for r in miss.missing() {
            self.fill(vm, r.start.0, r.len);
            self.check(None);
        }
        let evicted = self.atc.counters().evict > evict_before;
        let retry = self.translate(vm, iova, len, need);
        let end = iova + len;
        let mapped = (iova..end).all(|b| self.model.regions(vm).any(|m| contains(m, b)));
        if mapped && !evicted {
            assert!(
                !matches!(retry, Err(AtcError::Miss(_))),
                "filling the reported ranges did not resolve the miss: {retry:?}"
            );
        }
    }

    /// Records the epochs after a step (checked in `check`).
    fn sync_epochs(&mut self) {
        for v in 0..VMS {
            self.epochs[v as usize] = self.table.epoch(VmId(v));
            self.epoch_max = self.epoch_max.max(self.epochs[v as usize]);
        }
    }

    /// After every step: both invariant checkers; the authority equals the model; only the VM
    /// whose regions changed got a new epoch, larger than any before; the cache's fresh entries
    /// are exactly the model's, each a current region of that VM.
    fn check(&self, changed: Option<u32>) {
        self.table
            .check_invariants()
            .expect("region table invariants");
        self.atc.check_invariants().expect("atc invariants");
        assert!(self.atc.len() <= self.atc.config().entries_max);
        for v in 0..VMS {
            let got: Vec<Mapping> = self.table.regions(VmId(v)).copied().collect();
            let want: Vec<Mapping> = self.model.regions(v).copied().collect();
            assert_eq!(got, want, "vm {v}'s regions");
            let epoch = self.table.epoch(VmId(v));
            if changed == Some(v) {
                assert!(epoch > self.epoch_max, "vm {v}: a change takes a new epoch");
            } else {
                assert_eq!(epoch, self.epochs[v as usize], "vm {v}: epoch moved");
            }
            let cached: Vec<Mapping> = self.model.cached(v).copied().collect();
            for m in &cached {
                assert!(want.contains(m), "model: cached {m:?} is not current");
            }
            assert_eq!(self.fresh(v), cached, "vm {v}'s fresh cache entries");
        }
    }
}
