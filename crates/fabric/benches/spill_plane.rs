//! The spill plane model's cost per train (ADR 0011, step 4): one single-packet train of one
//! of 1,024 connections the plane owns, 200 ns after the last (5 Mpps, within eight workers'
//! 7 Mpps), its reply to the DPU drained, and the plane's timers run when due, as a driver
//! does. `shards_1` is the plane of one shard (the simulator's and the real-time plane's
//! default); `shards_2` routes each train to one of two shards by its bucket.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway_fabric::params::FabricParams;
use spillway_fabric::spill::SpillPlane;
use spillway_fabric::types::{Colour, ConnId, ConnState, Kind, Msg, SyncKind};
use spillway_vswitch::Instant;

const CONNS: u64 = 1_024;
const STEP_NS: u64 = 200;
const WORKERS: u32 = 8;

#[path = "../tests/common/train.rs"]
mod train;
use train::train;

fn bench_plane(c: &mut Criterion, name: &str, shards: u32) {
    let mut f = FabricParams::default();
    f.dpu.shards = shards;
    f.validate().expect("valid parameters");
    let mut plane = SpillPlane::new(&f);
    let colour = Colour(1);
    let mut now = Instant(0);
    plane.start(now, WORKERS);
    plane.handle_msg(now, Msg::Activated { colour });
    for i in 0..CONNS {
        let mut state = ConnState::open(now, &train(ConnId(i), Kind::Open, 1, now));
        state.phase = spillway_fabric::types::ConnPhase::Established;
        let kind = SyncKind::Handover;
        plane.handle_msg(
            now,
            Msg::Sync {
                colour,
                kind,
                state,
            },
        );
    }
    while plane.poll_transmit().is_some() {}
    assert_eq!(plane.conns_owned(), CONNS);
    let mut g = c.benchmark_group("spill_plane");
    g.throughput(Throughput::Elements(1));
    let mut i = 0u64;
    g.bench_function(name, |b| {
        b.iter(|| {
            now = Instant(now.0 + STEP_NS);
            if plane.poll_timeout().is_some_and(|t| t <= now) {
                plane.handle_timeout(now);
            }
            i = (i + 1) % CONNS;
            let msg = Msg::Packets(train(ConnId(i), Kind::Data, 1, now));
            plane.handle_msg(now, msg);
            while let Some(t) = plane.poll_transmit() {
                black_box(t);
            }
        });
    });
    g.finish();
    assert!(plane.counters().processed > 0, "the plane served");
}

fn per_train(c: &mut Criterion) {
    bench_plane(c, "shards_1", 1);
    bench_plane(c, "shards_2", 2);
}

criterion_group!(benches, per_train);
criterion_main!(benches);
