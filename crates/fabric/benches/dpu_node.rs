//! The DPU model's cost per train on the fast path, by how the node reaches the DPU's
//! resources (ADR 0011): its own `Resources` (the real-time driver's one shard), a
//! `ShardCell` shared by the shards of one node (the simulator's), and a `Mutex` shared by
//! shards (what a driver with one thread per shard would use; uncontended here, one thread).
//!
//! Each iteration offers one single-packet train of one of 1,024 established connections
//! whose hardware entries are live, 200 ns after the last (5 Mpps, under the 7.2 Mpps fast
//! path), and runs the node's timers when they are due, as a driver does.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway_fabric::dpu::{DpuNode, ResourcesHandle};
use spillway_fabric::params::FabricParams;
use spillway_fabric::types::{ConnId, Kind};
use spillway_vswitch::Instant;

const CONNS: u64 = 1_024;
const STEP_NS: u64 = 200;

#[path = "../tests/common/locked.rs"]
mod locked;
#[path = "../tests/common/train.rs"]
mod train;
use locked::{Locked, resources};
use train::train;

fn params(shards: u32) -> FabricParams {
    let mut f = FabricParams {
        dpu_only: true,
        ..FabricParams::default()
    };
    f.dpu.shards = shards;
    f.validate().expect("valid parameters");
    f
}

fn locked(shards: u32) -> DpuNode<Locked> {
    let f = params(shards);
    let res = resources(&f);
    DpuNode::with_shards(&f, (0..shards).map(|_| Locked(Arc::clone(&res))).collect())
}

fn bench_node<R: ResourcesHandle>(c: &mut Criterion, name: &str, mut dpu: DpuNode<R>) {
    let mut now = Instant(0);
    for i in 0..CONNS {
        dpu.handle_train(now, &train(ConnId(i), Kind::Open, 1, now));
    }
    // The SoC opens them in about 1 ms (8 us each on 8 cores); the inserts follow.
    now = Instant(5_000_000);
    while let Some(t) = dpu.poll_timeout().filter(|t| *t <= now) {
        dpu.handle_timeout(t);
    }
    assert_eq!(dpu.hw_entries() as u64, 2 * CONNS, "entries live");
    let mut g = c.benchmark_group("dpu_node");
    g.throughput(Throughput::Elements(1));
    let mut i = 0u64;
    g.bench_function(name, |b| {
        b.iter(|| {
            now = Instant(now.0 + STEP_NS);
            if dpu.poll_timeout().is_some_and(|t| t <= now) {
                dpu.handle_timeout(now);
            }
            i = (i + 1) % CONNS;
            dpu.handle_train(now, &train(ConnId(i), Kind::Data, 1, now));
            black_box(dpu.delivered_last())
        });
    });
    g.finish();
    assert!(dpu.counters().hw_delivered > 0, "the fast path served");
}

fn fast_path(c: &mut Criterion) {
    bench_node(c, "own_resources", DpuNode::new(&params(1)));
    bench_node(c, "shard_cell_1", DpuNode::sharded(&params(1)));
    bench_node(c, "shard_cell_2", DpuNode::sharded(&params(2)));
    bench_node(c, "mutex_1", locked(1));
    bench_node(c, "mutex_2", locked(2));
}

criterion_group!(benches, fast_path);
criterion_main!(benches);
