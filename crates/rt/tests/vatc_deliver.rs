//! The spill plane's vATC delivery on a real VM memory (a sealed memfd mapped twice, as the VM
//! and the plane map it): every frame the plane delivers lands byte for byte in the buffer the VM
//! posted on its plane receive queue, a miss reports the buffer's range and leaves it posted, a
//! translation filled from the authority's regions is then used, a buffer posted in a region the
//! VM may not have written (its transmit area) is refused by permission and never written, and an
//! invalidation at a new epoch stops every use of the old translation. A counting allocator
//! shows that the delivery path (translate, copy, publish, interrupt check, the VM's reclaim and
//! repost) allocates nothing per frame after warm-up.

use spillway_fabric::atc::{Atc, AtcConfig, AtcEpoch, RegionTable, VmId};
use spillway_rt::dpu::vmport::{DirectRefused, PlaneVm, regions};
use spillway_rt::shm::ring::Doorbell;
use spillway_rt::shm::virtq::{DriverQueue, QUEUE_RX_PLANE, QUEUE_TX, VmLayout, VmMemory};

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

use spillway_testkit::allocations;

fn layout() -> VmLayout {
    VmLayout {
        queue_size: 64,
        buf_bytes: 2048,
        iova_base: 3 << 36,
    }
}

/// The VM's memory, the plane's mapping of it, the authority and a fresh cache.
fn setup() -> (VmMemory, PlaneVm, RegionTable, Atc, VmId) {
    let vm = VmId(2);
    let mem = VmMemory::create("vatc-test", layout()).unwrap();
    let plane_mem = VmMemory::from_fd(rustix::io::dup(mem.fd()).unwrap()).unwrap();
    let mut authority = RegionTable::new();
    for m in regions(mem.layout()) {
        authority.map(vm, m).unwrap();
    }
    let irq = Doorbell::new().unwrap();
    let plane = PlaneVm::new(vm, plane_mem, irq, authority.epoch(vm));
    let atc = Atc::new(AtcConfig { entries_max: 8 }).unwrap();
    (mem, plane, authority, atc, vm)
}

/// Caches every region of `vm` the authority has, as the DPU's answer to a request does.
fn fill_all(atc: &mut Atc, authority: &RegionTable, vm: VmId, l: &VmLayout) {
    let all: Vec<_> = authority.regions(vm).copied().collect();
    let whole = spillway_fabric::atc::Iova(l.iova_base);
    atc.fill_from(
        vm,
        authority.epoch(vm),
        all.iter(),
        whole,
        l.total_bytes() as u64,
    )
    .unwrap();
}

#[test]
fn frames_land_in_the_posted_buffer_after_one_miss_and_fill() {
    let (mem, mut plane, authority, mut atc, vm) = setup();
    let mut rx = DriverQueue::new(&mem, QUEUE_RX_PLANE);
    let id = rx.take_free().unwrap();
    rx.post(&mem, id, 2048);
    let hdr = [0x11u8; 12];
    let frame: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
    // Cold: a miss naming the buffer's range; the buffer stays posted.
    let miss = match plane.deliver(&mut atc, &hdr, &frame) {
        Err(DirectRefused::Miss(m)) => m,
        other => panic!("expected a miss, got {other:?}"),
    };
    let want = mem.layout().iova(mem.layout().buf_off(QUEUE_RX_PLANE, id));
    assert_eq!(miss.missing()[0].start.0, want);
    assert_eq!(miss.missing()[0].len, 312);
    assert_eq!(rx.reclaim(&mem).unwrap(), None);
    // The authority's answer (its regions at its epoch), then the retry lands.
    let all: Vec<_> = authority.regions(vm).copied().collect();
    atc.fill_from(
        vm,
        authority.epoch(vm),
        all.iter(),
        miss.range.start,
        miss.range.len,
    )
    .unwrap();
    plane.deliver(&mut atc, &hdr, &frame).unwrap();
    let (got_id, len) = rx.reclaim(&mem).unwrap().unwrap();
    assert_eq!((got_id, len), (id, 312));
    let mut back = vec![0u8; 312];
    assert!(mem.read_bytes(rx.buf_off(&mem, id), &mut back));
    assert_eq!(&back[..12], &hdr);
    assert_eq!(&back[12..], &frame[..]);
}

#[test]
fn a_buffer_outside_the_receive_area_is_refused_and_never_written() {
    let (mem, mut plane, authority, mut atc, vm) = setup();
    let l = *mem.layout();
    fill_all(&mut atc, &authority, vm, &l);
    // A VM (buggy or hostile) posts a receive descriptor pointing into its transmit buffers.
    let tx_buf = l.buf_off(QUEUE_TX, 0);
    assert!(mem.write_bytes(tx_buf, &[0xee; 64]));
    let mut rx = DriverQueue::new(&mem, QUEUE_RX_PLANE);
    let id = rx.take_free().unwrap();
    rx.post(&mem, id, 2048);
    // Rewrite the descriptor's address (offset 0 of descriptor `id` in queue 2's table).
    let desc = l.desc_off(QUEUE_RX_PLANE) + 16 * usize::from(id);
    assert!(mem.write_bytes(desc, &l.iova(tx_buf).to_le_bytes()));
    assert_eq!(
        plane.deliver(&mut atc, &[0u8; 12], &[0x55; 100]),
        Err(DirectRefused::BadDesc)
    );
    assert_eq!(atc.counters().perm_denied, 1);
    let mut after = [0u8; 64];
    assert!(mem.read_bytes(tx_buf, &mut after));
    assert_eq!(after, [0xee; 64], "the transmit area was not written");
    // The buffer went back to the VM empty.
    assert_eq!(rx.reclaim(&mem).unwrap(), Some((id, 0)));
}

#[test]
fn after_an_invalidation_the_old_translation_is_never_used() {
    let (mem, mut plane, mut authority, mut atc, vm) = setup();
    let l = *mem.layout();
    fill_all(&mut atc, &authority, vm, &l);
    let mut rx = DriverQueue::new(&mem, QUEUE_RX_PLANE);
    let id = rx.take_free().unwrap();
    rx.post(&mem, id, 2048);
    plane.deliver(&mut atc, &[0u8; 12], &[1u8; 60]).unwrap();
    assert!(rx.reclaim(&mem).unwrap().is_some());
    // The VM's memory changes (its port is torn down): the authority moves to a new epoch and
    // the plane hears of it; the entry filled at the old epoch is dead.
    authority.remove_vm(vm);
    plane.epoch = authority.epoch(vm);
    assert_ne!(plane.epoch, AtcEpoch::default());
    rx.post(&mem, id, 2048);
    assert!(matches!(
        plane.deliver(&mut atc, &[0u8; 12], &[2u8; 60]),
        Err(DirectRefused::Miss(_))
    ));
    assert!(atc.counters().stale >= 1);
    // Nothing was written: the buffer is still posted, not used.
    assert_eq!(rx.reclaim(&mem).unwrap(), None);
}

#[test]
fn delivery_allocates_nothing_per_frame() {
    let (mem, mut plane, authority, mut atc, vm) = setup();
    let l = *mem.layout();
    fill_all(&mut atc, &authority, vm, &l);
    let mut rx = DriverQueue::new(&mem, QUEUE_RX_PLANE);
    while let Some(id) = rx.take_free() {
        rx.post(&mem, id, 2048);
    }
    let frame = vec![0x42u8; 1500];
    let hdr = [0u8; 12];
    let mut round = |n: usize| {
        for i in 0..n {
            plane
                .deliver(&mut atc, &hdr, &frame[..64 + i % 1400])
                .unwrap();
            plane.flush_irq();
            let (id, _) = rx.reclaim(&mem).unwrap().unwrap();
            rx.post(&mem, id, 2048);
        }
    };
    round(100);
    let before = allocations();
    round(20_000);
    assert_eq!(
        allocations() - before,
        0,
        "the vATC delivery path allocated"
    );
}
