//! End-to-end pipeline cost on the synthetic DPU-scale workload (`spillway_vswitch::workload`):
//! one tenant, 64 VM ports with 1,000 security-group rules each (the admitting rule last),
//! 10,000 routes, 60-byte inner frames (64 bytes on the wire).
//!
//! - `vswitch/pipeline/fast_path_hit/{10k,1m}`: one iteration is one `process_batch` of 32
//!   frames that all hit the flow table, alternating an uplink batch (VXLAN decap + deliver)
//!   and a VM-port batch (encap toward the remote VTEP), in the workload's shuffled order. The
//!   frame reload into the reused buffers (the stand-in for the NIC's DMA) is included. 10k flows
//!   is the small working set, 1m the DPU-scale one whose flow table (2M entries) is far larger
//!   than any cache: the difference is the memory-bound part of the fast path. The 50 ns/packet
//!   budget (20 Mpps per core) is what these are held against.
//! - `vswitch/pipeline/slow_path_new_conn`: the first packet of a new connection arriving over
//!   VXLAN: parse, VNI, security group (1,000 rules), conntrack create, forward and reverse flow
//!   entries built and installed, actions applied; in batches of 32, on pipelines sized for
//!   100k connections and rebuilt (untimed) when they fill. Target: 1 us (1M connections/s).
//!
//! Fixed seed, virtual clock (50 ns per packet), so runs are comparable.

use std::hint::black_box;
use std::time::{Duration, Instant as StdInstant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use spillway_vswitch::pipeline::Pipeline;
use spillway_vswitch::policy::Policy;
use spillway_vswitch::workload::{UPLINK_PORT, Workload, WorkloadConfig};
use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};

const BATCH: usize = 32;

/// `(port, uplink?, first frame)` of full 32-frame batches, uplink and VM-port batches alternating.
fn schedule(w: &Workload) -> Vec<(PortId, bool, usize)> {
    let up: Vec<_> = (0..w.uplink().len() / BATCH)
        .map(|i| (UPLINK_PORT, true, i * BATCH))
        .collect();
    let mut down = Vec::new();
    for (port, start, end) in w.reply_segments() {
        down.extend(
            (start..end)
                .step_by(BATCH)
                .filter(|f| f + BATCH <= end)
                .map(|f| (port, false, f)),
        );
    }
    up.into_iter().zip(down).flat_map(|(a, b)| [a, b]).collect()
}

/// A pipeline with every flow's connection open and in steady state.
fn warmed(w: &Workload, policy: &Policy) -> Pipeline {
    let mut p = Pipeline::new(policy.clone(), w.pipeline_config()).unwrap();
    let mut bufs = vec![PacketBuf::default(); BATCH];
    let mut v = vec![Verdict::Forward(UPLINK_PORT); BATCH];
    // Uplink, replies, uplink again: afterwards both entries of every connection are steady.
    let mut now = 1;
    let mut uplink_pass = |p: &mut Pipeline, now: &mut u64| {
        for i in (0..w.uplink().len()).step_by(BATCH) {
            let n = BATCH.min(w.uplink().len() - i);
            for (k, buf) in bufs[..n].iter_mut().enumerate() {
                buf.load(w.uplink().get(i + k)).unwrap();
            }
            p.process_batch(Instant(*now), UPLINK_PORT, &mut bufs[..n], &mut v[..n]);
            *now += 50 * n as u64;
        }
    };
    uplink_pass(&mut p, &mut now);
    let mut b1 = [PacketBuf::default()];
    let mut v1 = [Verdict::Forward(UPLINK_PORT)];
    for (port, start, end) in w.reply_segments() {
        for i in start..end {
            b1[0].load(w.replies().get(i)).unwrap();
            p.process_batch(Instant(now), port, &mut b1, &mut v1);
            now += 50;
        }
    }
    uplink_pass(&mut p, &mut now);
    p
}

fn fast_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("vswitch/pipeline/fast_path_hit");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for (name, flows) in [("10k", 10_000), ("1m", 1_000_000)] {
        let w = Workload::new(WorkloadConfig {
            flows,
            ..WorkloadConfig::default()
        })
        .unwrap();
        let policy = Policy::compile(w.policy_config(), "workload").unwrap();
        let mut p = warmed(&w, &policy);
        let sched = schedule(&w);
        let mut bufs = vec![PacketBuf::default(); 8 * BATCH];
        let mut v = vec![Verdict::Forward(UPLINK_PORT); BATCH];
        let (mut i, mut now) = (0usize, 1u64 << 40);
        let hits_before = p.counters().fast_path_hits;
        let mut batches = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                let (port, uplink, first) = sched[i % sched.len()];
                let ring = &mut bufs[(i % 8) * BATCH..(i % 8 + 1) * BATCH];
                let set = if uplink { w.uplink() } else { w.replies() };
                for (k, buf) in ring.iter_mut().enumerate() {
                    buf.load(set.get(first + k)).unwrap();
                }
                p.process_batch(Instant(now), port, ring, &mut v);
                now += 50 * BATCH as u64;
                i += 1;
                batches += 1;
                black_box(&v);
            })
        });
        let hits = p.counters().fast_path_hits - hits_before;
        assert_eq!(
            hits,
            batches * BATCH as u64,
            "every packet must be a fast-path hit"
        );
    }
    g.finish();
}

fn slow_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("vswitch/pipeline");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    let w = Workload::new(WorkloadConfig {
        flows: 100_000,
        ..WorkloadConfig::default()
    })
    .unwrap();
    let policy = Policy::compile(w.policy_config(), "workload").unwrap();
    let n = w.uplink().len();
    g.bench_function("slow_path_new_conn", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters as usize;
            let mut bufs = vec![PacketBuf::default(); BATCH];
            let mut v = vec![Verdict::Forward(UPLINK_PORT); BATCH];
            while left > 0 {
                let mut p = Pipeline::new(policy.clone(), w.pipeline_config()).unwrap();
                let todo = left.min(n);
                let t0 = StdInstant::now();
                for i in (0..todo).step_by(BATCH) {
                    let m = BATCH.min(todo - i);
                    for (k, buf) in bufs[..m].iter_mut().enumerate() {
                        buf.load(w.uplink().get(i + k)).unwrap();
                    }
                    p.process_batch(
                        Instant(1 + i as u64),
                        UPLINK_PORT,
                        &mut bufs[..m],
                        &mut v[..m],
                    );
                }
                total += t0.elapsed();
                assert_eq!(p.counters().new_connections, todo as u64);
                left -= todo;
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, fast_path, slow_path);
criterion_main!(benches);
