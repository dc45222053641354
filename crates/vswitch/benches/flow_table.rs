//! Flow table lookup cost at DPU scale.
//!
//! Measures `FlowTable` with 1,000,000 entries keyed by a 48-byte `(port, vni, FlowKey)` match,
//! far larger than any cache, so every random lookup would pay DRAM latency twice (bucket, then
//! entry) without prefetching. `lookup_batch_1m` looks up 32 random present keys per iteration
//! through the software-pipelined batch API; `lookup_single_1m` looks up one random key per
//! iteration through the plain API (the prefetch-free baseline); `lookup_batch_10k` is the batch
//! against a 10,000-entry table that fits in cache (the CPU cost alone); `insert_remove` inserts a fresh
//! key into a 90%-full table and removes it again (the slow path's install/expire pair). These set
//! the budget of the fast path: a whole packet (parse + lookup + actions) must fit in 50 ns.
//! Keys and probe order come from a fixed-seed splitmix64, so runs are comparable.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway_vswitch::Instant;
use spillway_vswitch::flow_table::{EntryIdx, EvictBy, FlowTable, FlowTableConfig, FullPolicy};
use spillway_wire::{FlowKey, IpAddr16, ip_proto};

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct BenchMatch {
    port: u32,
    vni: u32,
    key: FlowKey,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn key(i: u64) -> BenchMatch {
    let [a, b, c, d] = (i as u32).to_be_bytes();
    BenchMatch {
        port: (i % 64) as u32,
        vni: 100 + (i % 7) as u32,
        key: FlowKey {
            src_ip: IpAddr16::from_v4([10, a, b, c]),
            dst_ip: IpAddr16::from_v4([172, 16, d, 1]),
            src_port: 1024 + (i % 50_000) as u16,
            dst_port: 443,
            proto: ip_proto::TCP,
        },
    }
}

const N: u64 = 1_000_000;

fn table(capacity: usize, n: u64) -> FlowTable<BenchMatch, u64> {
    let mut t = FlowTable::new(FlowTableConfig {
        capacity,
        idle_timeout: Duration::from_secs(3600),
        full: FullPolicy::Reject,
        evict: EvictBy::LeastRecentlyUsed,
        evict_sample: 8,
        hash_seed: 42,
    })
    .expect("valid config");
    for i in 0..n {
        t.insert(Instant(1), key(i), i, true).expect("room");
    }
    t
}

fn benches(c: &mut Criterion) {
    let mut t = table(N as usize, N);
    let mut rng = 7u64;
    let probes: Vec<BenchMatch> = (0..(1 << 20))
        .map(|_| key(splitmix(&mut rng) % N))
        .collect();
    let mask = probes.len() - 1;

    let mut g = c.benchmark_group("vswitch/flow_table");
    g.sample_size(20).measurement_time(Duration::from_secs(3));

    g.throughput(Throughput::Elements(32));
    let mut pos = 0usize;
    let bytes = [1500u32; 32];
    let mut out = [None::<EntryIdx>; 32];
    g.bench_function("lookup_batch_1m", |b| {
        b.iter(|| {
            let keys = &probes[pos..pos + 32];
            pos = (pos + 32) & mask;
            t.lookup_batch(Instant(2), keys, &bytes, &mut out);
            black_box(&out);
        })
    });

    // The same batch against a table that fits in cache: the CPU cost alone, for the ratio.
    let mut small = table(10_000, 10_000);
    let small_probes: Vec<BenchMatch> = (0..(1 << 20))
        .map(|_| key(splitmix(&mut rng) % 10_000))
        .collect();
    g.bench_function("lookup_batch_10k", |b| {
        b.iter(|| {
            let keys = &small_probes[pos..pos + 32];
            pos = (pos + 32) & mask;
            small.lookup_batch(Instant(2), keys, &bytes, &mut out);
            black_box(&out);
        })
    });
    drop(small);

    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup_single_1m", |b| {
        b.iter(|| {
            let k = &probes[pos];
            pos = (pos + 1) & mask;
            black_box(t.lookup(Instant(2), k, 1500))
        })
    });
    drop(t);

    let mut t = table(N as usize, N * 9 / 10);
    let mut next = N;
    g.bench_function("insert_remove", |b| {
        b.iter(|| {
            let k = key(next);
            next += 1;
            t.insert(Instant(3), k, next, true).expect("room");
            black_box(t.remove(&k))
        })
    });
    g.finish();
}

criterion_group!(flow_table, benches);
criterion_main!(flow_table);
