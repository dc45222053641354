//! Tests of the authority and the cache together: translation, miss reporting, permissions,
//! epochs, invalidation, eviction and the negative cache.

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
