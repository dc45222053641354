//! Several shards, one DPU (ADR 0011): two [`DpuNode`]s on two threads, each with its own
//! connections, charging one [`Resources`] through a handle behind a lock, as a driver that
//! forwards on several threads does. The limits are the DPU's, not a thread's: a 30 kpps fast
//! path admits about 30 kpps in total however the traffic falls on the shards (not 30 kpps
//! per shard), and a shard that carries most of the traffic gets most of it (not half).

use std::sync::{Arc, Barrier, Mutex, MutexGuard};
use std::thread;

use spillway_fabric::dpu::{DpuNode, EmulatedHardware, Resources, ResourcesHandle};
use spillway_fabric::params::FabricParams;
use spillway_fabric::types::{ConnId, Dest, Kind, Side, Train};
use spillway_vswitch::{Instant, TenantId};

/// A shard's handle to the DPU's one `Resources`.
#[derive(Debug)]
struct Shared(Arc<Mutex<Resources>>);

impl ResourcesHandle for Shared {
    type Read<'a> = MutexGuard<'a, Resources>;
    type Write<'a> = MutexGuard<'a, Resources>;
    const EXCLUSIVE: bool = false;
    fn read(&self) -> MutexGuard<'_, Resources> {
        self.0
            .lock()
            .expect("a shard panicked holding the resources")
    }
    fn write(&mut self) -> MutexGuard<'_, Resources> {
        self.0
            .lock()
            .expect("a shard panicked holding the resources")
    }
}

const FAST_PATH_PPS: f64 = 30_000.0;
const QUEUE: u32 = 32;
/// Simulated time each shard runs, in 1 ms steps kept in lockstep across the threads.
const STEPS_MS: u64 = 1_000;

fn params() -> FabricParams {
    let mut f = FabricParams::default();
    f.dpu.hw_pps_limit = FAST_PATH_PPS;
    f.dpu.hw_queue_packets = QUEUE;
    f.dpu_only = true;
    f.validate().expect("valid parameters");
    f
}

fn train(conn: ConnId, kind: Kind, packets: u32, at: Instant) -> Train {
    Train {
        conn,
        tenant: TenantId(1),
        side: Side::Orig,
        dest: Dest::Wire,
        kind,
        packets,
        packet_bytes: 64,
        born: at,
        denied: false,
    }
}

/// Runs one shard: `conns` connections opened at 0, then `pps` packets per second of them
/// (ten packets per connection per train) for `STEPS_MS` ms, in step with the other shard.
/// Returns the packets its fast path delivered.
fn shard(res: Arc<Mutex<Resources>>, first: u64, conns: u64, pps: u64, step: &Barrier) -> u64 {
    let f = params();
    let mut dpu = DpuNode::with_resources(&f, Shared(res));
    let ms = |m: u64| Instant(m * 1_000_000);
    let ids: Vec<ConnId> = (first..first + conns).map(ConnId).collect();
    for id in &ids {
        dpu.handle_train(ms(0), &train(*id, Kind::Open, 1, ms(0)));
    }
    // Trains of ten packets, `pps` packets per second, spread evenly over each ms.
    let mut owed = 0; // packets per thousand seconds
    let mut next = 0usize;
    for m in 1..=STEPS_MS {
        step.wait();
        owed += pps;
        let trains = owed / 10_000;
        owed -= trains * 10_000;
        for k in 0..trains {
            let at = Instant(ms(m).0 + k * 1_000_000 / trains);
            while let Some(due) = dpu.poll_timeout().filter(|due| *due <= at) {
                dpu.handle_timeout(due);
            }
            dpu.handle_train(at, &train(ids[next], Kind::Data, 10, at));
            next = (next + 1) % ids.len();
        }
        while dpu.poll_transmit().is_some() {}
        while dpu.poll_command().is_some() {}
        while dpu.poll_event().is_some() {}
    }
    dpu.check_invariants().expect("shard invariants");
    assert_eq!(dpu.conns_len() as u64, conns, "every connection opened");
    dpu.counters().hw_delivered
}

/// Two shards offered `a_pps` and `b_pps`: the packets each one's fast path delivered.
fn run(a_pps: u64, b_pps: u64) -> (u64, u64) {
    let f = params();
    let res = Arc::new(Mutex::new(Resources::new(
        &f,
        Box::new(EmulatedHardware::new(&f)),
    )));
    let step = Arc::new(Barrier::new(2));
    let spawn = |first: u64, pps: u64| {
        let (res, step) = (Arc::clone(&res), Arc::clone(&step));
        thread::spawn(move || shard(res, first, 64, pps, &step))
    };
    let a = spawn(0, a_pps);
    let b = spawn(1_000, b_pps);
    (a.join().unwrap(), b.join().unwrap())
}

/// At most the fast path's rate over the run, plus what its queue held at the end.
fn most() -> u64 {
    (FAST_PATH_PPS as u64) * STEPS_MS / 1_000 + u64::from(QUEUE)
}

#[test]
fn two_shards_share_one_fast_path_rate() {
    // 40 kpps each: 80 kpps offered to a 30 kpps fast path.
    let (a, b) = run(40_000, 40_000);
    let total = a + b;
    assert!(total <= most(), "admitted {total} > {}", most());
    // Saturated all run long (less the first ms while the entries went live).
    assert!(total >= most() * 95 / 100, "admitted only {total}");
    // Neither shard starves the other when they offer the same.
    assert!(a.abs_diff(b) <= total / 5, "a {a}, b {b}");
}

#[test]
fn a_shard_with_most_of_the_traffic_gets_most_of_the_fast_path() {
    // 54 kpps on one shard, 6 kpps on the other: an even split of the limit (15 kpps each)
    // would refuse the busy shard work the DPU has room for.
    let (a, b) = run(54_000, 6_000);
    let total = a + b;
    assert!(total <= most(), "admitted {total} > {}", most());
    assert!(a > most() / 2 + 5_000, "busy shard got {a} of {total}");
    assert!(b > 0, "the quiet shard got nothing");
}
