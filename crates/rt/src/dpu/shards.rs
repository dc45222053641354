//! The DPU model's control part and its shards on separate threads (ADR 0011, step 3's
//! plumbing): how thread 0 reaches the DPU's one [`Resources`] ([`DpuResources`]: its own with
//! one thread, the [`SharedResources`] every forwarding thread charges with several). The
//! transport between the control part and the shards is [`crate::shards`]'s, which the spill
//! plane's threads use too.
//!
//! The DPU process's forwarding threads (`forward.rs`) use them when `fabric.dpu.shards > 1`.

use std::sync::MutexGuard;

pub use crate::shards::{ShardEnd, SharedResources, ThreadShards};
use spillway_fabric::dpu::{Resources, ResourcesHandle};

/// How the DPU process's thread 0 reaches the DPU's [`Resources`]: its own with one
/// forwarding thread (today's process: no lock), or the [`SharedResources`] every forwarding
/// thread charges.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "the owned variant is the one-thread process's hot path: a box would add a \
              pointer chase to every charge; there is one of these per process"
)]
pub enum DpuResources {
    /// The only thread's.
    Own(Resources),
    /// Shared with the other forwarding threads.
    Shared(SharedResources),
}

/// A read guard of [`DpuResources`].
#[derive(Debug)]
pub enum ResourcesRead<'a> {
    /// The thread's own.
    Own(&'a Resources),
    /// The shared ones, locked.
    Shared(MutexGuard<'a, Resources>),
}

/// A write guard of [`DpuResources`].
#[derive(Debug)]
pub enum ResourcesWrite<'a> {
    /// The thread's own.
    Own(&'a mut Resources),
    /// The shared ones, locked.
    Shared(MutexGuard<'a, Resources>),
}

impl std::ops::Deref for ResourcesRead<'_> {
    type Target = Resources;
    fn deref(&self) -> &Resources {
        match self {
            ResourcesRead::Own(r) => r,
            ResourcesRead::Shared(g) => g,
        }
    }
}

impl std::ops::Deref for ResourcesWrite<'_> {
    type Target = Resources;
    fn deref(&self) -> &Resources {
        match self {
            ResourcesWrite::Own(r) => r,
            ResourcesWrite::Shared(g) => g,
        }
    }
}

impl std::ops::DerefMut for ResourcesWrite<'_> {
    fn deref_mut(&mut self) -> &mut Resources {
        match self {
            ResourcesWrite::Own(r) => r,
            ResourcesWrite::Shared(g) => g,
        }
    }
}

impl ResourcesHandle for DpuResources {
    type Read<'a> = ResourcesRead<'a>;
    type Write<'a> = ResourcesWrite<'a>;
    // With one thread the node's records are all of them, but the handle's type cannot say
    // which variant it holds: the node's own count check is the simulator's.
    const EXCLUSIVE: bool = false;
    fn read(&self) -> ResourcesRead<'_> {
        match self {
            DpuResources::Own(r) => ResourcesRead::Own(r),
            DpuResources::Shared(s) => ResourcesRead::Shared(s.lock()),
        }
    }
    fn write(&mut self) -> ResourcesWrite<'_> {
        match self {
            DpuResources::Own(r) => ResourcesWrite::Own(r),
            DpuResources::Shared(s) => ResourcesWrite::Shared(s.lock()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{Sender, SyncSender, channel, sync_channel};
    use std::thread;

    use spillway_fabric::dpu::{
        DpuControl, DpuNode, DpuShard, EmulatedHardware, EventKind, Hold, Phase, Role, ShardView,
        shard_of,
    };
    use spillway_fabric::params::FabricParams;
    use spillway_fabric::types::{
        ConnId, ConnPhase, ConnState, Dest, Kind, Msg, Side, SyncKind, Train,
    };
    use spillway_vswitch::{Instant, TenantId};

    use super::*;

    fn ms(m: u64) -> Instant {
        Instant(m * 1_000_000)
    }

    fn open(conn: ConnId, at: Instant) -> Train {
        Train {
            conn,
            tenant: TenantId(1),
            side: Side::Orig,
            dest: Dest::Wire,
            kind: Kind::Open,
            packets: 1,
            packet_bytes: 64,
            born: at,
            denied: false,
        }
    }

    /// A shard's records (connection, role) and the messages it sent since the last report.
    type Report = (Vec<(ConnId, Role)>, Vec<Msg>);

    /// What the test hands a forwarding thread besides the control part's requests.
    enum Work {
        Train(Train, ShardView),
        Msg(Msg, ShardView),
        /// Report the shard's records and outgoing messages so far.
        Report(SyncSender<Report>),
        Stop,
    }

    /// The same inputs through a `DpuNode` of two shards (in one thread) and through a
    /// `DpuControl` with two shards on two forwarding threads give the same lifecycle: the
    /// same events, the same records, the same messages to the plane.
    #[test]
    fn a_control_thread_drives_shards_on_forwarding_threads_as_the_node_drives_its_own() {
        let mut f = FabricParams::default();
        f.dpu.shards = 2;
        let buckets = f.dpu.redirect_buckets;
        let conns: Vec<ConnId> = (0..5).map(ConnId).collect();
        let plane_conns: Vec<ConnId> = (100..102).map(ConnId).collect();
        let mirror = |conn: ConnId, colour| Msg::Sync {
            colour,
            kind: SyncKind::Mirror,
            state: ConnState {
                conn,
                tenant: TenantId(1),
                phase: ConnPhase::Established,
                packets: 3,
                version: 1,
                opened: ms(4),
            },
        };

        // One thread: the node.
        let mut node = DpuNode::sharded(&f);
        for c in &conns {
            node.handle_train(ms(0), &open(*c, ms(0)));
        }
        node.handle_timeout(ms(1));
        node.handle_hold(ms(1), Hold::Shadow);
        node.handle_plane_up(ms(2));
        let colour = match node.phase() {
            Phase::Shadow { colour, .. } => colour,
            p => panic!("{p:?}"),
        };
        let mut node_out: Vec<Msg> = std::iter::from_fn(|| node.poll_transmit())
            .map(|t| t.msg)
            .collect();
        for c in &plane_conns {
            node.handle_msg(ms(4), mirror(*c, colour));
        }
        node.handle_plane_failed(ms(5), "killed");
        node_out.extend(std::iter::from_fn(|| node.poll_transmit()).map(|t| t.msg));
        let node_events: Vec<(EventKind, String)> = std::iter::from_fn(|| node.poll_event())
            .map(|e| (e.what, e.reason))
            .collect();
        let mut node_records: Vec<(ConnId, Role)> = node
            .conns_sorted()
            .into_iter()
            .map(|(k, c)| (k, c.role))
            .collect();
        node_records.sort_unstable();

        // Threads: a control part here, a shard on each of two forwarding threads.
        let res = SharedResources::new(Resources::new(&f, Box::new(EmulatedHardware::new(&f))));
        let mut shards = ThreadShards::new();
        let mut work = Vec::new();
        let mut threads = Vec::new();
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..2 {
            let (work_tx, work_rx) = channel::<Work>();
            let mut shard = DpuShard::with_resources(&f, res.share());
            let waker = Arc::new(std::sync::OnceLock::<thread::Thread>::new());
            let w = Arc::clone(&waker);
            let end = shards.add(move || {
                if let Some(t) = w.get() {
                    t.unpark();
                }
            });
            let stop = Arc::clone(&stop);
            let (ready_tx, ready_rx) = sync_channel(0);
            threads.push(thread::spawn(move || {
                waker.set(thread::current()).expect("set once");
                ready_tx.send(()).expect("the test waits");
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    while let Ok(w) = work_rx.try_recv() {
                        match w {
                            Work::Train(t, view) => shard.handle_train(t.born, &t, view),
                            Work::Msg(m, view) => shard.handle_msg(ms(4), m, view),
                            Work::Report(tx) => {
                                out.extend(
                                    std::iter::from_fn(|| shard.poll_transmit()).map(|t| t.msg),
                                );
                                let records = (0..200)
                                    .map(ConnId)
                                    .filter_map(|c| shard.conn(c).map(|r| (c, r.role)))
                                    .collect();
                                tx.send((records, core::mem::take(&mut out)))
                                    .expect("the test waits");
                            }
                            Work::Stop => return,
                        }
                    }
                    shard.complete_due_inserts(ms(1));
                    end.serve(|req| shard.serve(req));
                    out.extend(std::iter::from_fn(|| shard.poll_transmit()).map(|t| t.msg));
                    thread::park_timeout(std::time::Duration::from_millis(1));
                }
            }));
            ready_rx.recv().expect("the thread starts");
            work.push(work_tx);
        }
        // The test waits for each thread's report before moving on, so the work it sent and
        // the requests that follow reach a shard in order.
        let report = |work: &[Sender<Work>]| {
            let mut records = Vec::new();
            let mut out = Vec::new();
            for w in work {
                let (tx, rx) = sync_channel(1);
                w.send(Work::Report(tx)).expect("thread alive");
                let (r, o) = rx.recv().expect("thread alive");
                records.extend(r);
                out.push(o);
            }
            (records, out)
        };
        let mut control = DpuControl::new(&f);
        for c in &conns {
            let k = shard_of(*c, buckets, 2);
            work[k]
                .send(Work::Train(open(*c, ms(0)), control.view()))
                .expect("thread alive");
        }
        report(&work);
        control.handle_timeout(ms(1), &mut shards);
        control.handle_hold(ms(1), Hold::Shadow, &mut shards);
        control.handle_plane_up(ms(2), &mut shards);
        assert_eq!(
            control.phase(),
            Phase::Shadow {
                colour,
                synced: false
            }
        );
        let (_, out) = report(&work);
        let mut thread_out: Vec<Msg> = out.concat();
        for c in &plane_conns {
            let k = shard_of(*c, buckets, 2);
            work[k]
                .send(Work::Msg(mirror(*c, colour), control.view()))
                .expect("thread alive");
        }
        report(&work);
        control.handle_plane_failed(ms(5), "killed", &mut shards);
        let (mut records, out) = report(&work);
        thread_out.extend(out.concat());
        records.sort_unstable();
        let events: Vec<(EventKind, String)> = std::iter::from_fn(|| control.poll_event())
            .map(|e| (e.what, e.reason))
            .collect();
        stop.store(true, Ordering::Relaxed);
        for w in &work {
            let _ = w.send(Work::Stop);
        }
        for t in threads {
            t.join().expect("forwarding thread");
        }

        assert_eq!(events, node_events);
        let reason = |k: EventKind| {
            events
                .iter()
                .find(|(what, _)| *what == k)
                .map_or("", |(_, r)| r.as_str())
        };
        assert!(
            reason(EventKind::Shadow).contains("bulk sync of 5 connections"),
            "{events:?}"
        );
        assert!(
            reason(EventKind::FailOpen).contains("2 connections taken over"),
            "{events:?}"
        );
        assert_eq!(records, node_records);
        let key = |m: &Msg| format!("{m:?}");
        let (mut a, mut b): (Vec<String>, Vec<String>) = (
            thread_out.iter().map(key).collect(),
            node_out.iter().map(key).collect(),
        );
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "the same messages to the plane");
        assert!(
            records.iter().all(|(_, r)| *r == Role::Owner),
            "{records:?}"
        );
        assert_eq!(records.len(), conns.len() + plane_conns.len());
    }
}
