//! Connection tracking cost at a million connections.
//!
//! `create` measures opening a UDP connection (both tuples indexed) into a tracker that fills up
//! to 1,000,000 connections; the tracker is emptied, untimed, whenever it is full, so every timed
//! create lands in a table holding between 0 and 1M connections, mostly far larger than any cache.
//! Connection setup rate (CPS) is one of the DPU limits that makes Spillway spill, so this bounds
//! the slow path's CPS per core. `lookup_1m` looks up random existing tuples (original or reply
//! direction) in a tracker holding 1,000,000 connections: the per-packet cost of the stateful
//! check on the slow path. `lookup_10k` repeats it on 10,000 connections (a 10,000-capacity tracker
//! whose index and slab fit in cache) for the CPU-only ratio. Keys and probes come from a fixed-seed splitmix64.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway_vswitch::conntrack::{Conntrack, ConntrackConfig, CtHandle};
use spillway_vswitch::{Instant, TenantId};
use spillway_wire::{FlowKey, IpAddr16, ip_proto};

const N: usize = 1_000_000;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn key(i: u64) -> FlowKey {
    let [a, b, c, d] = (i as u32).to_be_bytes();
    FlowKey {
        src_ip: IpAddr16::from_v4([10, a, b, c]),
        dst_ip: IpAddr16::from_v4([192, 168, d, 1]),
        src_port: 1024 + (i % 60_000) as u16,
        dst_port: 53,
        proto: ip_proto::UDP,
    }
}

fn tracker(capacity: usize) -> Conntrack {
    Conntrack::new(ConntrackConfig {
        capacity,
        hash_seed: 11,
        ..ConntrackConfig::default()
    })
    .expect("valid config")
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("vswitch/conntrack");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(1));

    let mut t = tracker(N);
    let mut live: Vec<CtHandle> = Vec::with_capacity(N);
    let mut next = 0u64;
    g.bench_function("create", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters as usize;
            while left > 0 {
                if live.len() == N {
                    for h in live.drain(..) {
                        t.remove(h);
                    }
                }
                let n = left.min(N - live.len());
                let start = std::time::Instant::now();
                for _ in 0..n {
                    let k = key(next);
                    next += 1;
                    let h = t
                        .create(Instant(1), TenantId(1), k, k.reversed(), 0, next, |_| {})
                        .expect("room");
                    live.push(h);
                }
                total += start.elapsed();
                left -= n;
            }
            total
        })
    });
    drop(live);
    drop(t);

    let mut t = tracker(N);
    for i in 0..N as u64 {
        let k = key(i);
        t.create(Instant(1), TenantId(1), k, k.reversed(), 0, i, |_| {})
            .expect("room");
    }
    let mut rng = 3u64;
    let probes: Vec<FlowKey> = (0..(1 << 20))
        .map(|_| {
            let r = splitmix(&mut rng);
            let k = key(r % N as u64);
            if r >> 63 == 0 { k } else { k.reversed() }
        })
        .collect();
    let mask = probes.len() - 1;
    let mut pos = 0;
    g.bench_function("lookup_1m", |b| {
        b.iter(|| {
            let k = &probes[pos];
            pos = (pos + 1) & mask;
            black_box(t.lookup(Instant(2), TenantId(1), k))
        })
    });
    drop(t);

    // The same lookups in a tracker that fits in cache: the CPU cost alone, for the ratio.
    let small = 10_000u64;
    let mut t = tracker(small as usize);
    for i in 0..small {
        let k = key(i);
        t.create(Instant(1), TenantId(1), k, k.reversed(), 0, i, |_| {})
            .expect("room");
    }
    let small_probes: Vec<FlowKey> = (0..(1 << 20))
        .map(|_| key(splitmix(&mut rng) % small))
        .collect();
    g.bench_function("lookup_10k", |b| {
        b.iter(|| {
            let k = &small_probes[pos];
            pos = (pos + 1) & mask;
            black_box(t.lookup(Instant(2), TenantId(1), k))
        })
    });
    g.finish();
}

criterion_group!(conntrack, benches);
criterion_main!(conntrack);
