//! The spill plane's shards on two threads (ADR 0011, step 4): the control part with shard 0
//! on one thread, shard 1 on another, both charging the plane's one `PlaneResources` behind a
//! `Mutex` (the core takes no lock; a driver gives its threads such a handle). The control
//! part reaches shard 1 only by requests over a channel, as a driver's control thread would.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;

use spillway_fabric::frame::{Model, PlaneShardModel};
use spillway_fabric::params::FabricParams;
use spillway_fabric::spill::{
    PlaneReply, PlaneRequest, PlaneResources, PlaneResourcesHandle, PlaneShard, PlaneShards,
    PlaneView, SpillPlane,
};
use spillway_fabric::types::{Colour, ConnId, ConnState, Kind, Msg, SyncKind, Transmit};
use spillway_vswitch::Instant;

#[path = "common/train.rs"]
mod train;
use train::train;

/// A thread's handle to the plane's one `PlaneResources`.
#[derive(Debug, Clone)]
struct Locked(Arc<Mutex<PlaneResources>>);

impl PlaneResourcesHandle for Locked {
    type Read<'a> = MutexGuard<'a, PlaneResources>;
    type Write<'a> = MutexGuard<'a, PlaneResources>;
    fn read(&self) -> MutexGuard<'_, PlaneResources> {
        self.0
            .lock()
            .expect("a shard panicked holding the resources")
    }
    fn write(&mut self) -> MutexGuard<'_, PlaneResources> {
        self.0
            .lock()
            .expect("a shard panicked holding the resources")
    }
}

/// What the test and the control part give shard 1's thread.
enum Job {
    /// A request of the control part.
    Request(PlaneRequest),
    /// A message from the DPU about one of shard 1's connections, with the view to see it by.
    Msg(Instant, Msg, PlaneView),
    /// Stop.
    Quit,
}

/// The way to shard 1's thread, which the control part (as its `PlaneShards`) and the test
/// (as the driver handing shard 1 its connections' messages) share: every job's reply comes
/// back with what the shard sent the DPU meanwhile, collected in `sent`.
#[derive(Debug, Clone)]
struct ToShard1(Arc<Mutex<Link>>);

#[derive(Debug)]
struct Link {
    jobs: Sender<Job>,
    replies: Receiver<(Option<PlaneReply>, Vec<Transmit>)>,
    sent: Vec<Transmit>,
}

impl ToShard1 {
    fn run(&self, job: Job) -> Option<PlaneReply> {
        let mut link = self.0.lock().unwrap();
        link.jobs.send(job).expect("shard 1's thread runs");
        let (reply, sent) = link.replies.recv().expect("shard 1's thread replies");
        link.sent.extend(sent);
        reply
    }
    /// Stops the thread (it answers nothing).
    fn quit(&self) {
        let link = self.0.lock().unwrap();
        link.jobs.send(Job::Quit).expect("shard 1's thread runs");
    }
    fn take_sent(&self) -> Vec<Transmit> {
        std::mem::take(&mut self.0.lock().unwrap().sent)
    }
}

impl PlaneShards for ToShard1 {
    fn count(&self) -> usize {
        1
    }
    fn call(&mut self, shard: usize, req: PlaneRequest) -> PlaneReply {
        assert_eq!(shard, 0, "one shard through this transport");
        self.run(Job::Request(req)).expect("a request's reply")
    }
}

/// Shard 1 of two on a thread of its own, charging `res`.
fn spawn_shard1(
    f: &FabricParams,
    res: Locked,
) -> (thread::JoinHandle<PlaneShardModel<Locked>>, ToShard1) {
    let (jobs_tx, jobs) = channel::<Job>();
    let (replies, replies_rx) = channel();
    let shard = PlaneShard::new(f, 1, 2);
    let view = PlaneView {
        colour: Colour(0),
        active: false,
        releasing: false,
        vatc: false,
    };
    let h = thread::spawn(move || {
        let mut model = PlaneShardModel::new(shard, view, res);
        for job in jobs {
            let reply = match job {
                Job::Request(req) => Some(model.serve(req)),
                Job::Msg(now, msg, view) => {
                    model.set_view(view);
                    Model::handle_msg(&mut model, now, msg);
                    None
                }
                Job::Quit => break,
            };
            let sent = std::iter::from_fn(|| model.poll_transmit()).collect();
            replies.send((reply, sent)).expect("the test listens");
        }
        model
    });
    let link = Link {
        jobs: jobs_tx,
        replies: replies_rx,
        sent: Vec::new(),
    };
    (h, ToShard1(Arc::new(Mutex::new(link))))
}

fn ms(m: u64) -> Instant {
    Instant(m * 1_000_000)
}

/// The control part on this thread with shard 0, shard 1 on another: the DPU's messages about
/// a connection reach its shard's thread, both shards' packets queue for the plane's one set
/// of workers, and a release and a drain reach both shards, each of which ends its step with
/// its own marker.
#[test]
fn a_plane_over_two_threads_shares_its_workers_and_releases_every_shard() {
    let mut f = FabricParams::default();
    f.dpu.shards = 2;
    let res = Locked(Arc::new(Mutex::new(PlaneResources::new(&f, 1))));
    let (h, to1) = spawn_shard1(&f, res.clone());
    let mut plane = SpillPlane::with_remote(&f, res.clone(), Box::new(to1.clone()));
    let colour = Colour(1);
    plane.start(ms(0), 1);
    plane.handle_msg(ms(0), Msg::Activated { colour });

    // The DPU hands over 16 connections; each message goes to its shard's thread (the driver
    // routes by `Msg::conn`), with the control part's view.
    let conns: Vec<ConnId> = (1..=16).map(ConnId).collect();
    let (c0, c1): (Vec<ConnId>, Vec<ConnId>) = conns.iter().partition(|&&c| plane.shard_of(c) == 0);
    assert!(!c0.is_empty() && !c1.is_empty(), "{c0:?} {c1:?}");
    let deliver = |plane: &mut SpillPlane<Locked>, now, msg: Msg| {
        let conn = msg.conn().expect("a connection's message");
        if plane.shard_of(conn) == 0 {
            plane.handle_msg(now, msg);
        } else {
            to1.run(Job::Msg(now, msg, plane.view()));
        }
    };
    for &c in &conns {
        let state = ConnState::open(ms(1), &train(c, Kind::Open, 1, ms(1)));
        let kind = SyncKind::Handover;
        deliver(
            &mut plane,
            ms(1),
            Msg::Sync {
                colour,
                kind,
                state,
            },
        );
    }
    assert_eq!(plane.conns_owned(), c0.len() as u64, "shard 0's, held here");

    // A burst of 400 packets on each connection at the same instant: one worker and its
    // queue take what they can, whichever shard offers; the rest are refused.
    for &c in &conns {
        deliver(
            &mut plane,
            ms(2),
            Msg::Packets(train(c, Kind::Data, 400, ms(2))),
        );
    }
    let model1 = {
        to1.quit();
        h.join().expect("shard 1's thread")
    };
    let served = res.read().workers().served_total();
    let processed = plane.counters().processed + model1.shard().counters().processed;
    assert_eq!(served, processed, "one set of workers served both shards");
    let queue = u64::from(f.pcie.phy_vnic_ring);
    assert!(
        processed <= 1 + queue && processed < 16 * 400,
        "{processed} processed: one worker and its queue of {queue}, not one per shard"
    );
    assert!(
        model1.shard().counters().processed > 0 && plane.counters().processed > 0,
        "both shards' packets were served"
    );
}

/// The same two threads through a release and a drain: both shards hand their connections
/// back and each sends its own `Released` and `Drained`.
#[test]
fn a_release_over_two_threads_ends_with_a_marker_from_each_shard() {
    let mut f = FabricParams::default();
    f.dpu.shards = 2;
    let res = Locked(Arc::new(Mutex::new(PlaneResources::new(&f, 2))));
    let (h, to1) = spawn_shard1(&f, res.clone());
    let mut plane = SpillPlane::with_remote(&f, res, Box::new(to1.clone()));
    let colour = Colour(1);
    plane.start(ms(0), 2);
    plane.handle_msg(ms(0), Msg::Activated { colour });
    let conns: Vec<ConnId> = (1..=16).map(ConnId).collect();
    let mut owned = [0u64; 2];
    for &c in &conns {
        let state = ConnState::open(ms(1), &train(c, Kind::Open, 1, ms(1)));
        let msg = Msg::Sync {
            colour,
            kind: SyncKind::Handover,
            state,
        };
        let shard = plane.shard_of(c);
        owned[shard] += 1;
        if shard == 0 {
            plane.handle_msg(ms(1), msg);
        } else {
            to1.run(Job::Msg(ms(1), msg, plane.view()));
        }
    }
    // The end of the DPU's bulk sync on shard 1's set reaches the control part: shard 1
    // acknowledges it on its own flow vNIC.
    let ack = Msg::SyncDone {
        colour,
        count: owned[1],
        shard: 1,
    };
    plane.handle_msg(ms(1), ack);
    while plane.poll_transmit().is_some() {}
    let acks: Vec<Msg> = to1
        .take_sent()
        .into_iter()
        .map(|t| t.msg)
        .filter(|m| matches!(m, Msg::SyncDone { .. }))
        .collect();
    assert_eq!(acks, [ack]);

    plane.handle_msg(ms(2), Msg::Release { colour });
    for shard in [0, 1] {
        let drain = Msg::Drain {
            colour,
            shard,
            packets: 0,
        };
        plane.handle_msg(ms(3), drain);
    }
    let mut here: Vec<Transmit> = std::iter::from_fn(|| plane.poll_transmit()).collect();
    here.extend(to1.take_sent());
    let mut released: Vec<(u16, u64)> = here
        .iter()
        .filter_map(|t| match t.msg {
            Msg::Released { count, shard, .. } => Some((shard, count)),
            _ => None,
        })
        .collect();
    released.sort_unstable();
    assert_eq!(released, [(0, owned[0]), (1, owned[1])]);
    let handovers = here
        .iter()
        .filter(|t| {
            matches!(
                t.msg,
                Msg::Sync {
                    kind: SyncKind::Handover,
                    ..
                }
            )
        })
        .count();
    assert_eq!(handovers, 16, "every connection went back");
    let mut drained: Vec<u16> = here
        .iter()
        .filter_map(|t| match t.msg {
            Msg::Drained { shard, .. } => Some(shard),
            _ => None,
        })
        .collect();
    drained.sort_unstable();
    assert_eq!(drained, [0, 1]);
    to1.quit();
    h.join().expect("shard 1's thread");
}

/// A driver that hands the plane an input about a connection of a shard it does not hold has
/// routed it wrong: the plane says so rather than serve it from the wrong records.
#[test]
#[should_panic(expected = "served elsewhere")]
fn an_input_for_a_shard_served_elsewhere_is_refused() {
    let mut f = FabricParams::default();
    f.dpu.shards = 2;
    let res = Locked(Arc::new(Mutex::new(PlaneResources::new(&f, 1))));
    let (_h, to1) = spawn_shard1(&f, res.clone());
    let mut plane = SpillPlane::with_remote(&f, res, Box::new(to1));
    plane.start(ms(0), 1);
    let conn = (1..)
        .map(ConnId)
        .find(|&c| plane.shard_of(c) == 1)
        .expect("a connection of shard 1");
    plane.handle_msg(ms(1), Msg::Packets(train(conn, Kind::Data, 1, ms(1))));
}
