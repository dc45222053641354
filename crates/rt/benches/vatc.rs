//! What delivering one spilled packet into a VM costs on each path, in one process and one
//! thread, so the two are measured side by side in the same run. `rt/vatc/direct/<size>` is the
//! spill plane's vATC path: translate the VM's posted receive buffer through the `Atc` (a hit),
//! copy header and frame into the VM's memory, publish it on the used ring, check whether the VM
//! wants an interrupt; plus the VM taking the buffer back and posting it again.
//! `rt/vatc/via_dpu/<size>` is the user-space work of the return path it replaces: the plane
//! pushes the frame on a phy ring, the DPU pops it and writes it into receive queue 1 with the
//! DPU process's own code (`vmport::fill_rx`: descriptor checked against the VM's memory map,
//! write, publish), then checks for an interrupt; plus the same VM work. Neither
//! includes what the real paths add on top (the DPU process's wake-up and the PCIe crossings the
//! model charges). The VM polls (no interrupts), as a busy one does. Sizes: 64 B and 1500 B.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spillway_fabric::atc::{Atc, AtcConfig, Iova, RegionTable, VmId};
use spillway_rt::dpu::vmport::{Filled, PlaneVm, fill_rx, regions};
use spillway_rt::shm::ring::{Doorbell, SharedRing};
use spillway_rt::shm::virtq::{
    DeviceQueue, DriverQueue, QUEUE_RX_DPU, QUEUE_RX_PLANE, VmLayout, VmMemory,
};

const SIZES: [usize; 2] = [64, 1500];

fn layout() -> VmLayout {
    VmLayout {
        queue_size: 256,
        buf_bytes: 2048,
        iova_base: 5 << 36,
    }
}

/// A VM's memory, a second mapping of it (the device's), and the VM's end of receive queue `q`
/// with every buffer posted. A busy VM polls: it asks for no interrupts (an idle one would cost
/// an eventfd write per wake-up on either path).
fn vm_with_posted_rx(q: usize) -> (VmMemory, VmMemory, DriverQueue) {
    let mem = VmMemory::create("bench-vm", layout()).unwrap();
    let device = VmMemory::from_fd(rustix::io::dup(mem.fd()).unwrap()).unwrap();
    let mut rx = DriverQueue::new(&mem, q);
    while let Some(id) = rx.take_free() {
        rx.post(&mem, id, mem.layout().buf_bytes);
    }
    rx.woke(&mem);
    (mem, device, rx)
}

fn direct(c: &mut Criterion) {
    let mut group = c.benchmark_group("rt/vatc/direct");
    for size in SIZES {
        let vm = VmId(1);
        let (mem, plane_mem, mut rx) = vm_with_posted_rx(QUEUE_RX_PLANE);
        let mut authority = RegionTable::new();
        for m in regions(mem.layout()) {
            authority.map(vm, m).unwrap();
        }
        let mut atc = Atc::new(AtcConfig::default()).unwrap();
        let l = *mem.layout();
        atc.fill(&authority, vm, Iova(l.iova_base), l.total_bytes() as u64)
            .unwrap();
        let mut plane = PlaneVm::new(vm, plane_mem, Doorbell::new().unwrap(), authority.epoch(vm));
        let hdr = [0u8; 12];
        let frame = vec![0x5au8; size];
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::from_parameter(format!("{size}B")), |b| {
            b.iter(|| {
                plane.deliver(&mut atc, &hdr, black_box(&frame)).unwrap();
                plane.flush_irq();
                let (id, len) = rx.reclaim(&mem).unwrap().unwrap();
                rx.post(&mem, id, l.buf_bytes);
                black_box(len)
            })
        });
    }
    group.finish();
}

fn via_dpu(c: &mut Criterion) {
    let mut group = c.benchmark_group("rt/vatc/via_dpu");
    for size in SIZES {
        let (mem, dpu_mem, mut rx) = vm_with_posted_rx(QUEUE_RX_DPU);
        let l = *mem.layout();
        let ring = SharedRing::create("bench-phy", 1 << 20).unwrap();
        let (mut to_dpu, mut at_dpu) = ring.split().unwrap();
        let mut dev = DeviceQueue::attach(&dpu_mem, QUEUE_RX_DPU);
        let hdr = [0u8; 12];
        let frame = vec![0x5au8; size];
        group.throughput(Throughput::Elements(1));
        group.bench_function(BenchmarkId::from_parameter(format!("{size}B")), |b| {
            b.iter(|| {
                to_dpu.try_push_parts(&[&hdr, black_box(&frame)]).unwrap();
                at_dpu
                    .pop_with(|rec| {
                        let (hdr, frame) = rec.split_at(12);
                        let filled = fill_rx(&dpu_mem, &mut dev, hdr, frame).unwrap();
                        assert_eq!(filled, Filled::Written);
                        black_box(dev.needs_interrupt(&dpu_mem))
                    })
                    .unwrap();
                let (id, len) = rx.reclaim(&mem).unwrap().unwrap();
                rx.post(&mem, id, l.buf_bytes);
                black_box(len)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, direct, via_dpu);
criterion_main!(benches);
