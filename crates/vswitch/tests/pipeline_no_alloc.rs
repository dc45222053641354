//! Proves that the pipeline's fast path allocates nothing per packet after warm-up, in both
//! directions (VXLAN decap + deliver on the uplink, encap toward the remote VTEP on VM ports),
//! and that the slow path allocates nothing per new connection either (it prints the count). A counting global allocator
//! (per thread, so the test harness's own threads do not interfere) wraps `System`; the test
//! drives the synthetic workload of `spillway_vswitch::workload` through `process_batch` and
//! compares counts before and after.

use spillway_vswitch::pipeline::Pipeline;
use spillway_vswitch::policy::Policy;
use spillway_vswitch::workload::{UPLINK_PORT, Workload, WorkloadConfig};
use spillway_vswitch::{Instant, PacketBuf, Verdict};

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

fn allocs() -> u64 {
    spillway_testkit::allocations()
}

const BATCH: usize = 32;

/// Runs every frame of both directions through the pipeline in batches.
fn both_directions(
    p: &mut Pipeline,
    w: &Workload,
    bufs: &mut [PacketBuf],
    v: &mut [Verdict],
    now: &mut u64,
) -> u64 {
    let mut packets = 0;
    for i in (0..w.uplink().len()).step_by(BATCH) {
        let n = BATCH.min(w.uplink().len() - i);
        for (k, buf) in bufs[..n].iter_mut().enumerate() {
            buf.load(w.uplink().get(i + k)).expect("frames fit");
        }
        p.process_batch(Instant(*now), UPLINK_PORT, &mut bufs[..n], &mut v[..n]);
        *now += 50 * n as u64;
        packets += n as u64;
    }
    for (port, start, end) in w.reply_segments() {
        for i in (start..end).step_by(BATCH) {
            let n = BATCH.min(end - i);
            for (k, buf) in bufs[..n].iter_mut().enumerate() {
                buf.load(w.replies().get(i + k)).expect("frames fit");
            }
            p.process_batch(Instant(*now), port, &mut bufs[..n], &mut v[..n]);
            *now += 50 * n as u64;
            packets += n as u64;
        }
    }
    packets
}

#[test]
fn fast_path_hits_allocate_nothing_in_either_direction() {
    let flows = 4_000;
    let w = Workload::new(WorkloadConfig {
        flows,
        ..WorkloadConfig::default()
    })
    .unwrap();
    let policy = Policy::compile(w.policy_config(), "workload").unwrap();
    let mut p = Pipeline::new(policy, w.pipeline_config()).unwrap();
    let mut bufs = vec![PacketBuf::default(); BATCH];
    let mut v = vec![Verdict::Forward(UPLINK_PORT); BATCH];
    let mut now = 1u64;

    // Slow path: the first packet of every flow opens its connection.
    let before = allocs();
    for i in (0..w.uplink().len()).step_by(BATCH) {
        let n = BATCH.min(w.uplink().len() - i);
        for (k, buf) in bufs[..n].iter_mut().enumerate() {
            buf.load(w.uplink().get(i + k)).unwrap();
        }
        p.process_batch(Instant(now), UPLINK_PORT, &mut bufs[..n], &mut v[..n]);
        now += 50 * n as u64;
    }
    let slow_allocs = allocs() - before;
    assert_eq!(p.counters().new_connections, flows as u64);
    println!(
        "slow path: {slow_allocs} allocations for {flows} new connections ({:.3} per connection)",
        slow_allocs as f64 / flows as f64
    );
    // Measured 0: tables are preallocated and entries are built on the stack. Kept as a check.
    assert_eq!(
        slow_allocs, 0,
        "slow path allocated {slow_allocs} times for {flows} connections"
    );

    // Warm-up: replies move every connection to its steady state.
    both_directions(&mut p, &w, &mut bufs, &mut v, &mut now);

    let hits_before = p.counters().fast_path_hits;
    let slow_before = p.counters().slow_path_packets;
    let before = allocs();
    let packets = both_directions(&mut p, &w, &mut bufs, &mut v, &mut now);
    let fast_allocs = allocs() - before;
    assert_eq!(packets, 2 * flows as u64);
    assert_eq!(
        p.counters().fast_path_hits - hits_before,
        packets,
        "all fast-path hits"
    );
    assert_eq!(
        p.counters().slow_path_packets,
        slow_before,
        "no slow-path packet"
    );
    assert_eq!(
        fast_allocs, 0,
        "fast path allocated {fast_allocs} times for {packets} packets"
    );
}
