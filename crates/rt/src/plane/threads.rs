//! The spill plane's shards on threads of their own (`fabric.dpu.shards = N > 1`; ADR 0011,
//! step 4).
//!
//! ```text
//!   DPU thread 0 ◀── lane 0 + control socket ──▶ plane main thread: control part + shard 0
//!                                                   │ requests (ThreadShards) ▲ control-channel
//!                                                   ▼ view (Published)      │ messages, stats
//!   DPU thread k ◀── lane k ───────────────────▶ plane thread k: shard k
//! ```
//!
//! Thread k runs the core's frame node over shard k of the plane
//! ([`PlaneShardModel`]) on lane k of the vNIC set: the frames DPU thread k steered, the
//! states it synced, and what the node sends back, with no other thread between them. The
//! control part (lifecycle, heartbeats, placement, the reliable delete channel) stays on the
//! main thread with shard 0, and reaches shard k only by requests ([`ShardEnd`]), which
//! thread k answers at its next batch boundary; its view of the lifecycle reaches thread k
//! through [`Published`]. What thread k sends on the control channel (a delete, an adoption,
//! a swap's recall) goes to the main thread for the control socket, in order; what the DPU
//! sends on the control socket about shard k's connections the main thread passes to it.
//! The workers' budget (`PlaneResources`) is one, behind a lock ([`Shared`]).
//!
//! The threads are spawned after the process has dropped its privileges (so they inherit
//! the dropped credentials and the seccomp filter), each pinned to one CPU of the plane's
//! cpuset (thread k to the k-th allowed CPU, round robin). Nothing here blocks a thread on
//! another but the main thread's requests, which the shard threads answer without waiting
//! for anything.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use spillway_fabric::frame::{
    ConnTableCounters, FrameCounters, Outgoing, PlaneShardModel, PlaneSwitch,
};
use spillway_fabric::spill::{PlaneReply, PlaneRequest, PlaneResources, PlaneView, SpillCounters};
use spillway_fabric::stats::Drops;
use spillway_fabric::types::{Channel, Msg};
use spillway_vswitch::conntrack::CtSnapshot;
use spillway_vswitch::frag::FragCounters;
use spillway_vswitch::policy::Policy;
use spillway_vswitch::router::IcmpErrorCounters;
use spillway_vswitch::{DropCounters, Instant};

use crate::host::allocs;
use crate::host::clock::Clock;
use crate::plane::process::{PlaneCounters, Vatc, serve_lane_frames};
use crate::shards::{Bell, Crew, PUBLISH_NS, Published, ShardEnd, Shared, Spin};
use crate::shm::vnic::{FlowRecord, VnicLane};

/// Records a shard thread takes from its lane per ring per turn.
const BATCH: usize = 256;
/// Messages the main thread may hold for a shard thread, and a shard thread for the main.
const QUEUE: usize = 4096;

/// What the main thread hands a shard thread besides requests.
#[derive(Debug)]
pub(crate) enum FromMain {
    /// A message the DPU sent on the control socket about one of its connections.
    Msg(Msg, Option<CtSnapshot>),
    /// A new vSwitch policy (`ctl reload`) for its pipeline.
    Policy(Box<Policy>),
}

/// What a shard thread hands the main thread.
#[derive(Debug)]
pub(crate) enum ToMain {
    /// A message of the node's for the control socket.
    Out(Outgoing),
    /// The lane broke (a corrupt ring or record): the plane stops, and the DPU fails open.
    LaneFailed(String),
}

/// A shard thread's counters, published for the main thread's statistics to sum.
#[derive(Clone, Debug, Default)]
pub(crate) struct ThreadStats {
    pub(crate) spill: SpillCounters,
    pub(crate) drops: Drops,
    pub(crate) frame: FrameCounters,
    pub(crate) conns: ConnTableCounters,
    pub(crate) icmp: IcmpErrorCounters,
    pub(crate) frag: FragCounters,
    pub(crate) vswitch_drops: DropCounters,
    pub(crate) driver: PlaneCounters,
    pub(crate) conns_held: u64,
    pub(crate) forwarding_allocs: u64,
}

/// A shard thread's node.
pub(crate) type ShardSwitch = PlaneSwitch<PlaneShardModel<Shared<PlaneResources>>>;

/// What a shard thread is started with.
pub(crate) struct ThreadSpec {
    pub(crate) sw: ShardSwitch,
    pub(crate) lane: VnicLane,
    pub(crate) end: ShardEnd<PlaneRequest, PlaneReply>,
    pub(crate) bell: Arc<Bell>,
}

/// The main thread's handle on the shard threads.
#[derive(Debug)]
pub(crate) struct PlaneThreads {
    /// Shard k's thread is at index k - 1.
    to_shard: Vec<SyncSender<FromMain>>,
    bells: Vec<Arc<Bell>>,
    /// The main thread's own bell, which the shard threads ring.
    pub(crate) main_bell: Arc<Bell>,
    from_shards: Receiver<ToMain>,
    /// A message taken while getting ready to sleep.
    peeked: Option<ToMain>,
    view: Arc<Published<PlaneView>>,
    published: Option<PlaneView>,
    pub(crate) stats: Vec<Arc<Mutex<ThreadStats>>>,
    crew: Crew,
    /// Messages for the shard threads that found their queue full (dropped, counted:
    /// the DPU's reliable channel retransmits).
    pub(crate) dropped: u64,
}

impl PlaneThreads {
    /// The shard thread that takes a message of shard `k` (from 1).
    pub(crate) fn hand_to_shard(&mut self, k: usize, msg: Msg, snap: Option<CtSnapshot>) {
        // Rung whether or not it sleeps: it cannot look into its inbox before it sleeps, and
        // these are rare (what the DPU sent on the control socket about a connection).
        match self.to_shard[k - 1].try_send(FromMain::Msg(msg, snap)) {
            Ok(()) => self.bells[k - 1].ring(),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.dropped += 1,
        }
    }

    /// Gives every shard thread's pipeline `policy` (a new epoch there too), each at its next
    /// turn.
    pub(crate) fn set_policy(&mut self, policy: &Policy) {
        for (tx, bell) in self.to_shard.iter().zip(&self.bells) {
            // Waits for room: a policy is not dropped, and the threads never wait for us.
            if tx.send(FromMain::Policy(Box::new(policy.clone()))).is_ok() {
                bell.ring();
            }
        }
    }

    /// Publishes the control part's view if it changed.
    pub(crate) fn publish_view(&mut self, view: PlaneView) {
        if self.published != Some(view) {
            self.published = Some(view);
            self.view.publish(view);
            for b in &self.bells {
                b.ring();
            }
        }
    }

    /// What the shard threads handed the main thread since the last call.
    pub(crate) fn recv(&mut self) -> Option<ToMain> {
        self.peeked
            .take()
            .or_else(|| self.from_shards.try_recv().ok())
    }

    /// Before the main thread sleeps: marks it asleep; false if something came meanwhile
    /// (then it does not sleep).
    pub(crate) fn prepare_sleep(&mut self) -> bool {
        self.main_bell.mark_asleep();
        if self.peeked.is_none() {
            match self.from_shards.try_recv() {
                Ok(m) => self.peeked = Some(m),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return true,
            }
        }
        self.main_bell.woke();
        false
    }

    /// The shard threads' counters summed.
    pub(crate) fn stats(&self) -> ThreadStats {
        let mut sum = ThreadStats::default();
        for s in &self.stats {
            let s = s.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            sum.spill.add(&s.spill);
            sum.drops = sum.drops.merged(&s.drops);
            sum.frame.add(&s.frame);
            sum.conns.add(&s.conns);
            sum.icmp.add(&s.icmp);
            sum.frag.add(&s.frag);
            sum.vswitch_drops.merge(&s.vswitch_drops);
            sum.driver.add(&s.driver);
            sum.conns_held += s.conns_held;
            sum.forwarding_allocs += s.forwarding_allocs;
        }
        sum
    }

    /// Per shard thread (shard 1 first): frames it took from its lane, and records it holds.
    pub(crate) fn per_thread(&self) -> Vec<serde_json::Value> {
        self.stats
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                serde_json::json!({"frames_in": s.driver.frames_in, "conns": s.conns_held})
            })
            .collect()
    }

    /// Stops and joins every shard thread.
    pub(crate) fn stop(&mut self) {
        self.crew.stop();
    }
}

/// Starts one thread per spec (shards `1..`, in order), each pinned to a CPU of the
/// process's affinity set. The main thread then serves shard 0 and the control part, woken
/// by `main_bell` (made, as every eventfd, before the process gave up making them).
pub(crate) fn spawn(
    specs: Vec<ThreadSpec>,
    main_bell: Arc<Bell>,
    view: PlaneView,
    vatc: Arc<Mutex<Vatc>>,
    (clock, buckets): (Clock, u16),
) -> std::io::Result<PlaneThreads> {
    let (to_main, from_shards) = sync_channel(QUEUE);
    let view = Arc::new(Published::new(view));
    let crew = Crew::new("plane shard");
    let stop = crew.stop_flag();
    let cpus = allowed_cpus();
    pin(&cpus, 0);
    let shards = specs.len() + 1;
    let mut t = PlaneThreads {
        to_shard: Vec::new(),
        bells: Vec::new(),
        main_bell: Arc::clone(&main_bell),
        from_shards,
        peeked: None,
        view: Arc::clone(&view),
        published: None,
        stats: Vec::new(),
        crew,
        dropped: 0,
    };
    for spec in specs {
        let (tx, inbox) = sync_channel(QUEUE);
        let stats = Arc::new(Mutex::new(ThreadStats::default()));
        t.to_shard.push(tx);
        t.bells.push(Arc::clone(&spec.bell));
        t.stats.push(Arc::clone(&stats));
        let mut th = ShardThread {
            index: spec.lane.index(),
            sw: spec.sw,
            lane: Some(spec.lane),
            end: spec.end,
            bell: spec.bell,
            inbox,
            to_main: to_main.clone(),
            main_bell: Arc::clone(&main_bell),
            held: VecDeque::new(),
            view: Arc::clone(&view),
            // Not a generation the view has had: the first turn takes it as it is now.
            seen: u64::MAX,
            vatc: Arc::clone(&vatc),
            c: PlaneCounters::default(),
            stats,
            stop: Arc::clone(&stop),
            clock,
            records: Vec::with_capacity(BATCH),
            buckets,
            shards,
            allocs: allocs::Upkeep::default(),
            last_publish: Instant::ZERO,
            poll_set: Vec::with_capacity(2),
        };
        let cpus = cpus.clone();
        let bell = Arc::clone(&th.bell);
        // Unnamed: naming a thread is a prctl, which the seccomp filter refuses.
        let handle = std::thread::Builder::new().spawn(move || {
            pin(&cpus, th.index);
            th.run();
        })?;
        t.crew.add(handle, bell);
    }
    Ok(t)
}

/// The CPUs this process may run on (its cgroup's cpuset, as the kernel applied it).
fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Pins the calling thread to the `k`-th of `cpus` (round robin); logged if refused.
fn pin(cpus: &[usize], k: usize) {
    if cpus.is_empty() {
        return;
    }
    let cpu = cpus[k % cpus.len()];
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
        tracing::warn!(target: "spillway::plane", shard = k, cpu, error = %e, "could not pin the thread");
    } else {
        tracing::debug!(target: "spillway::plane", shard = k, cpu, "thread pinned");
    }
}

/// One shard thread: shard k of the plane on lane k.
struct ShardThread {
    index: usize,
    sw: ShardSwitch,
    /// `None` once it broke.
    lane: Option<VnicLane>,
    end: ShardEnd<PlaneRequest, PlaneReply>,
    bell: Arc<Bell>,
    inbox: Receiver<FromMain>,
    to_main: SyncSender<ToMain>,
    main_bell: Arc<Bell>,
    /// What the main thread's queue had no room for yet, in order.
    held: VecDeque<ToMain>,
    view: Arc<Published<PlaneView>>,
    seen: u64,
    vatc: Arc<Mutex<Vatc>>,
    c: PlaneCounters,
    stats: Arc<Mutex<ThreadStats>>,
    stop: Arc<AtomicBool>,
    clock: Clock,
    records: Vec<FlowRecord>,
    buckets: u16,
    shards: usize,
    allocs: allocs::Upkeep,
    last_publish: Instant,
    poll_set: Vec<libc::pollfd>,
}

impl ShardThread {
    fn run(&mut self) {
        let mut spin = Spin::default();
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.clock.now();
            if let Some(v) = self.view.newer(&mut self.seen) {
                self.sw.plane_mut().set_view(v);
            }
            let model = self.sw.plane_mut();
            let mut busy = self.end.serve(|req| model.serve(req)) > 0;
            busy |= self.poll_inbox(now);
            busy |= self.poll_lane(now);
            self.send_outgoing(now);
            if now.0.saturating_sub(self.last_publish.0) >= PUBLISH_NS {
                self.publish(now);
            }
            if spin.sleep_due(busy) {
                self.sleep();
            }
        }
        self.publish(self.clock.now());
    }

    fn poll_inbox(&mut self, now: Instant) -> bool {
        let mut n = 0;
        while n < BATCH {
            match self.inbox.try_recv() {
                Ok(FromMain::Msg(m, s)) => self.sw.handle_msg(now, m, s),
                Ok(FromMain::Policy(p)) => {
                    let mark = self.allocs.begin();
                    self.sw.set_policy(*p);
                    self.allocs.end(mark);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
            n += 1;
        }
        n > 0
    }

    /// Frames and records from the lane, through the node.
    fn poll_lane(&mut self, now: Instant) -> bool {
        let Some(lane) = self.lane.as_mut() else {
            return false;
        };
        let frames = serve_lane_frames(&mut self.sw, lane, &self.vatc, &mut self.c, now);
        let records = &mut self.records;
        let flow = lane.recv_flow(BATCH, |rec| records.push(rec));
        let n = match (frames, flow) {
            (Ok(a), Ok(b)) => a + b,
            (Err(e), _) | (_, Err(e)) => {
                let why = format!("lane {}: {e}", self.index);
                tracing::error!(target: "spillway::plane", error = %why, "the lane broke");
                self.held.push_back(ToMain::LaneFailed(why));
                self.lane = None;
                1
            }
        };
        for rec in self.records.drain(..) {
            match rec {
                FlowRecord::Msg(m, s) => self.sw.handle_msg(now, m, s),
                FlowRecord::Ct(s) => self.sw.handle_conntrack(now, &s),
            }
        }
        n > 0
    }

    /// The node's messages: on the lane, or to the main thread for the control socket.
    fn send_outgoing(&mut self, now: Instant) {
        while let Some(o) = self.sw.poll_transmit(now) {
            match (&o, self.lane.as_mut()) {
                (
                    Outgoing::Msg {
                        channel: Channel::Control,
                        ..
                    },
                    _,
                ) => self.held.push_back(ToMain::Out(o)),
                (_, Some(lane)) => {
                    debug_assert_eq!(
                        self.sw.lane_of(&o, self.buckets, self.shards),
                        self.index,
                        "{o:?}"
                    );
                    lane.send_outgoing_flow(&o);
                }
                (_, None) => {}
            }
        }
        let mut rang = false;
        while let Some(m) = self.held.pop_front() {
            match self.to_main.try_send(m) {
                Ok(()) => rang = true,
                Err(TrySendError::Full(m)) => {
                    self.held.push_front(m);
                    break;
                }
                Err(TrySendError::Disconnected(_)) => break,
            }
        }
        if rang {
            self.main_bell.ring_if_asleep();
        }
        if let Some(lane) = self.lane.as_mut() {
            lane.kick();
        }
    }

    fn publish(&mut self, now: Instant) {
        let mark = self.allocs.begin();
        self.last_publish = now;
        self.sw.expire(now);
        let shard = self.sw.plane().shard();
        let p = self.sw.pipeline();
        let s = ThreadStats {
            spill: *shard.counters(),
            drops: *shard.drops(),
            frame: *self.sw.counters(),
            conns: *self.sw.conns().counters(),
            icmp: p.icmp_error_counters().clone(),
            frag: p.frag_counters(),
            vswitch_drops: p.drops().clone(),
            driver: self.c,
            conns_held: shard.conns_len() as u64,
            forwarding_allocs: self.allocs.forwarding(),
        };
        *self
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
        self.allocs.end(mark);
    }

    fn sleep(&mut self) {
        self.bell.mark_asleep();
        let armed = self.lane.as_mut().is_none_or(VnicLane::prepare_sleep);
        if armed && self.held.is_empty() {
            let readable = |fd: i32| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            self.poll_set.clear();
            self.poll_set.push(readable(self.bell.fd().as_raw_fd()));
            if let Some(l) = &self.lane {
                self.poll_set.push(readable(l.bell_fd().as_raw_fd()));
            }
            // SAFETY: `poll_set` holds `len` initialised `pollfd`s of fds this thread holds
            // (its bell, its lane's doorbell), none closed during the call; `poll` writes only
            // `revents`. Every source is read again after waking.
            let _ = unsafe {
                libc::poll(
                    self.poll_set.as_mut_ptr(),
                    self.poll_set.len() as libc::nfds_t,
                    10,
                )
            };
        }
        if let Some(l) = self.lane.as_mut() {
            l.woke();
        }
        self.bell.woke();
    }
}
