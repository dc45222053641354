//! What one record costs on the cross-process ring, the channel every spilled frame crosses
//! twice (DPU to spill plane and back). `rt/ring/push_pop/<size>` pushes and pops one record on
//! one thread: the protocol's fixed cost (one Release store each way, the cached-index checks)
//! plus the copy in. `rt/ring/batch32/<size>` does the same 32 records at a time with one head
//! store and one tail store per batch, which is how the drivers use it; the ratio to
//! `push_pop` is what batching buys. `rt/ring/cross_thread/<size>` streams 100,000 records from
//! a producer thread to a consumer thread over two mappings of the same memfd (no doorbell;
//! a waiting side spins briefly, then yields), so the cache lines of head, tail and the data
//! really move between cores; it reports time per record, and needs two idle cores to mean
//! anything. Sizes: 64 B (a small message or minimum frame), 1500 B (an MTU frame) and 9000 B
//! (a jumbo frame); payload bytes are fixed, so the runs are reproducible.

use std::hint::black_box;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use spillway_rt::shm::ring::{PushError, SharedRing};

const SIZES: [usize; 3] = [64, 1500, 9000];
const RING_BYTES: usize = 1 << 20;

fn name(size: usize) -> String {
    format!("{size}B")
}

fn push_pop(c: &mut Criterion) {
    let mut group = c.benchmark_group("rt/ring/push_pop");
    for size in SIZES {
        let ring = SharedRing::create("bench", RING_BYTES).unwrap();
        let (mut producer, mut consumer) = ring.split().unwrap();
        let record = vec![0x5au8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::from_parameter(name(size)), |b| {
            b.iter(|| {
                producer.try_push(black_box(&record)).unwrap();
                consumer.pop_with(|r| black_box(r.len())).unwrap().unwrap()
            })
        });
    }
    group.finish();
}

fn batch32(c: &mut Criterion) {
    let mut group = c.benchmark_group("rt/ring/batch32");
    for size in SIZES {
        let ring = SharedRing::create("bench", RING_BYTES).unwrap();
        let (mut producer, mut consumer) = ring.split().unwrap();
        let record = vec![0x5au8; size];
        group.throughput(Throughput::Bytes(32 * size as u64));
        group.bench_function(BenchmarkId::from_parameter(name(size)), |b| {
            b.iter(|| {
                let mut batch = producer.batch();
                for _ in 0..32 {
                    batch.try_push(black_box(&record)).unwrap();
                }
                drop(batch);
                let mut bytes = 0;
                consumer.pop_batch(32, |r| bytes += r.len()).unwrap();
                black_box(bytes)
            })
        });
    }
    group.finish();
}

/// Waits a little for the other thread: on a shared 2-core machine pure spinning can starve
/// the very thread being waited for, so yield to the scheduler now and then.
fn backoff() {
    for _ in 0..64 {
        std::hint::spin_loop();
    }
    std::thread::yield_now();
}

/// Streams `records` records of `size` bytes between two threads; returns the elapsed time.
fn stream(size: usize, records: u64) -> Duration {
    let ring = SharedRing::create("bench", RING_BYTES).unwrap();
    let fd: OwnedFd = rustix::io::fcntl_dupfd_cloexec(ring.fd(), 0).unwrap();
    let mut producer = ring.into_producer().unwrap();
    let record = vec![0x5au8; size];
    let start = Instant::now();
    let consumer = std::thread::spawn(move || {
        let mut consumer = SharedRing::from_fd(fd).unwrap().into_consumer().unwrap();
        let mut got = 0u64;
        while got < records {
            let n = consumer.pop_batch(64, |r| _ = black_box(r.len())).unwrap();
            if n == 0 {
                backoff();
            }
            got += n as u64;
        }
    });
    let mut sent = 0u64;
    while sent < records {
        match producer.try_push(&record) {
            Ok(()) => sent += 1,
            Err(PushError::Full { .. }) => backoff(),
            Err(e) => panic!("{e}"),
        }
    }
    consumer.join().unwrap();
    start.elapsed()
}

fn cross_thread(c: &mut Criterion) {
    const RECORDS: u64 = 100_000;
    let mut group = c.benchmark_group("rt/ring/cross_thread");
    group.sample_size(10);
    for size in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::from_parameter(name(size)), |b| {
            // Time per record: each iteration streams RECORDS of them.
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| stream(size, RECORDS) / RECORDS as u32)
                    .sum()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, push_pop, batch32, cross_thread);
criterion_main!(benches);
