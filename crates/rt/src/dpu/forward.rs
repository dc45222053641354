//! The DPU process's forwarding threads (ADR 0011, step 3): with `fabric.dpu.shards = N > 1`,
//! the DPU model is split into N shards by connection bucket and each shard forwards on a
//! thread of its own.
//!
//! ```text
//!            TAP queue 0 ──▶ thread 0: control part + shard 0 ◀──▶ vNIC lane 0 + control socket
//!                                 ▲  │ requests (ThreadShards)        ctl, metrics, timers
//!              parcels (Links)    │  ▼ view (Published)
//!            TAP queue k ──▶ thread k: shard k ◀──────────────────▶ vNIC lane k
//! ```
//!
//! - Every thread reads queue k of every TAP through its own io_uring (the kernel picks a
//!   frame's queue by its own flow hash) and writes out of that queue.
//! - A shared-memory or vhost-user VM port has one receive queue with one producer: thread 0
//!   reads and writes it. A frame another thread sends to such a port goes to thread 0 in a
//!   pooled buffer ([`Parcel::ToPort`]); one thread 0 reads from it that is another shard's
//!   goes to that shard's thread like any other.
//! - A frame whose connection belongs to another shard (the node says so from its own parse,
//!   [`Outcome::Elsewhere`](spillway_fabric::frame::Outcome::Elsewhere), before it learns
//!   anything) is copied into a pooled buffer and handed to that shard's thread
//!   ([`Parcel::Frame`]), as software steering after RSS does; a frame of no connection (ARP,
//!   neighbour discovery, one that does not parse) is served where it arrived.
//! - Thread 0 holds the control part (the lifecycle, URSched's windows) inside its
//!   [`DpuNode::with_remote`](spillway_fabric::dpu::DpuNode::with_remote), the plane's process
//!   with its vNIC set's control socket and lane 0, `ctl` and the metrics. When the plane
//!   connects, thread 0 hands lane k to thread k ([`Parcel::Lane`]): shard k steers its frames
//!   to the plane and sends its flow records on its own lane, and takes the plane's frames and
//!   records for its connections from it. An end marker on lane k (the plane's shard k has
//!   sent all its records) goes to thread 0's control part ([`Parcel::Msg`]); shard k's
//!   control-channel messages go to thread 0 for the control socket ([`Parcel::Out`]), and
//!   what the plane sends on the control socket about shard k's connections thread 0 passes
//!   to thread k. A lane that breaks is reported to thread 0 ([`Parcel::LaneFailed`]), which
//!   fails the plane.
//! - With a warm plane (warm standby, or an upgrade) thread k holds lane k of both plane slots'
//!   sets: its shard's outbox goes on the slot the shard steers to
//!   ([`DpuShard::active_slot`], switched by the flip together with the outboxes), its warm
//!   outbox on the other, and each lane's records are taken as that slot's plane is to the
//!   shard (active, warm or fenced). A killed plane's lanes go back to thread 0
//!   ([`Parcel::LaneBack`]), which takes their phy rings back once the process is reaped;
//!   a frame steered to a slot whose lane is gone goes to thread 0 to be kept with them
//!   ([`Parcel::Keep`]), and all are offered again from thread 0 once the flip is done.
//! - The control part's requests reach shard k at thread k's next batch boundary
//!   ([`ShardEnd::serve`]); its view of the lifecycle (phase, colour, quota) is published after
//!   every turn of thread 0 and picked up by every thread at its next turn.
//! - The DPU's limits are one [`SharedResources`]: a 30 kpps fast path admits 30 kpps in total.
//! - `ctl status` and `/metrics` sum the threads' counters, which each thread publishes every
//!   100 ms ([`ShardStats`]).
//!
//! Nothing here blocks a forwarding thread on another: a parcel that finds its queue full (or
//! no free buffer) is dropped and counted (`rt.handoff.full`), except what thread 0 passes on
//! from the plane's reliable channel, for which it waits; and thread k keeps what it has for
//! thread 0 (up to [`TO_ZERO_MAX`] parcels, in order) until thread 0's queue has room.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use spillway_fabric::dpu::{
    DpuControl, DpuCounters, DpuNode, DpuShard, EmulatedHardware, Resources, ShardReply,
    ShardRequest, ShardView, shard_of,
};
use spillway_fabric::frame::{
    ConnTableCounters, DpuModel, DpuSwitch, FrameCounters, Outgoing, ShardModel, shard_capacities,
};
use spillway_fabric::params::FabricParams;
use spillway_fabric::stats::Drops;
use spillway_fabric::types::{Channel, Msg, PlaneSlot};
use spillway_vswitch::conntrack::CtSnapshot;
use spillway_vswitch::frag::FragCounters;
use spillway_vswitch::neigh::NeighCounters;
use spillway_vswitch::packet::HEADROOM;
use spillway_vswitch::policy::Policy;
use spillway_vswitch::router::IcmpErrorCounters;
use spillway_vswitch::{DropCounters, Instant, PacketBuf, PortId};

use crate::dpu::daemon::{
    Egress, PLAIN_VNET, PUBLISH_NS, Spin, Switch, gso_size, offer_frame, take_vnet,
};
use crate::dpu::ports::{
    FRAME_MAX, Port, PortIo, RtCounters, TAP_RING_READS, TAP_RING_TX, tap_hdr,
};
use crate::dpu::report::{FlowQuery, flow_rows};
use crate::dpu::shards::{DpuResources, ShardEnd, SharedResources, ThreadShards};
use crate::host::allocs;
use crate::host::clock::Clock;
use crate::host::tap_uring::{TapTx, TapUring, TapUringCounters};
use crate::host::vnet::VnetHdr;
use crate::shards::{Bell, Crew, Published};
use crate::shm::vnic::{FlowRecord, VnicLane};

/// Parcels a thread's inbox holds.
const INBOX: usize = 1024;
/// Frame buffers each thread hands frames to the others in. Each is big enough for a GSO
/// frame (64 KiB), so this bounds the memory the hand-off takes: about 17 MiB a thread.
const POOL: usize = 256;
/// Frame buffers thread 0 offers frames taken back from a failed plane again in, apart from
/// its own [`POOL`]: a burst of re-offers waits for these rather than take the buffers the
/// hand-off of frames read from the ports needs.
const REOFFER_POOL: usize = 64;
/// Parcels a thread takes from its inbox per turn.
const INBOX_BATCH: usize = 256;
/// Parcels a forwarding thread keeps for thread 0 while its queue is full.
const TO_ZERO_MAX: usize = 4096;
/// Records a forwarding thread takes from its lane per ring per turn.
const RING_BATCH: usize = 256;

use crate::dpu::daemon::Vnet;

/// What one thread hands another.
#[derive(Debug)]
pub(super) enum Parcel {
    /// A VM's frame read on thread `from`'s queue, of a connection of the receiver's shard;
    /// `reoffer`: thread 0 offers it again after a plane failed (see [`Parcel::Keep`]), so it
    /// is not kept a second time. `from` is the pool its buffer goes back to: the sending
    /// thread's, or (a re-offer) thread 0's re-offer pool, number `threads`.
    Frame {
        from: usize,
        port: PortId,
        vnet: Vnet,
        pkt: PacketBuf,
        reoffer: bool,
    },
    /// A message from the plane in `slot`: from thread 0's control socket about the
    /// receiver's connection, or to thread 0 from a lane, for the control part (an end
    /// marker or a digest, which the lane carried behind its shard's records).
    Msg {
        msg: Msg,
        snap: Option<CtSnapshot>,
        slot: PlaneSlot,
    },
    /// From thread 0: a conntrack change from the active plane of the receiver's connection.
    Ct(CtSnapshot),
    /// To thread 0: a message for the control socket of the plane in `slot`.
    Out { o: Outgoing, slot: PlaneSlot },
    /// From thread 0: the receiver's lane of the vNIC set of plane process number `plane`
    /// (its start count) in `slot`, which it now serves.
    Lane {
        lane: Box<VnicLane>,
        plane: u64,
        slot: PlaneSlot,
    },
    /// From thread 0: the plane in `slot` is gone; drop its lane, or (`reclaim`: it was
    /// killed) give it back ([`Parcel::LaneBack`]) so that what the plane never took from its
    /// phy ring is taken back once the process is reaped.
    LaneClosed { slot: PlaneSlot, reclaim: bool },
    /// To thread 0: the lane of killed plane `plane`, to take its phy ring back from.
    LaneBack { lane: Box<VnicLane>, plane: u64 },
    /// To thread 0: the lane of plane `plane` broke (a corrupt ring or record).
    LaneFailed { plane: u64, why: String },
    /// To thread 0: a frame of the sender's shard steered to a plane whose lane is gone (it
    /// failed, and the flip away from it is under way): thread 0 keeps it with what it took
    /// back from the plane's rings and offers it again once the core takes re-offers.
    Keep {
        from: usize,
        port: PortId,
        vnet: Vnet,
        pkt: PacketBuf,
    },
    /// To thread 0: a frame for a port only thread 0 serves (a shared-memory or vhost-user
    /// VM's: its receive queue has one producer), with the buffer's pool as in
    /// [`Parcel::Frame`].
    ToPort {
        from: usize,
        port: PortId,
        vnet: Vnet,
        pkt: PacketBuf,
    },
    /// From thread 0: `ctl flows` asks for this shard's rows and its record count.
    Flows(FlowQuery, SyncSender<FlowReply>),
    /// From thread 0: a new vSwitch policy (`ctl reload`) for this thread's pipeline.
    Policy(Box<Policy>),
}

/// A shard's answer to [`Parcel::Flows`]: its rows (with their connection ids) and how many
/// records it holds.
pub(super) type FlowReply = (Vec<(u64, serde_json::Value)>, usize);

spillway_vswitch::counters! {
    /// What the hand-off between forwarding threads did.
    pub struct HandoffCounters {
        /// Frames handed to the thread of their connection's shard.
        handed_off => "rt.handoff.frames",
        /// Frames for a port thread 0 serves (a shared-memory or vhost-user VM's), handed to
        /// thread 0.
        to_port => "rt.handoff.to_port",
        /// Parcels dropped because the receiver's queue or the sender's buffers were full.
        full => "rt.handoff.full",
        /// Frames and records from the plane on a lane that is not their connection's
        /// shard's, dropped (the plane sends each on its shard's lane).
        misrouted => "rt.lane.misrouted",
    }
}

/// A thread's ends of the hand-off between threads.
#[derive(Debug)]
pub(super) struct Links {
    me: usize,
    buckets: u16,
    inbox: Receiver<Parcel>,
    /// A parcel taken from the inbox while getting ready to sleep.
    peeked: Option<Parcel>,
    to: Vec<SyncSender<Parcel>>,
    bells: Vec<Arc<Bell>>,
    /// This thread's free frame buffers; the receivers give them back here.
    free: Receiver<PacketBuf>,
    /// Thread 0's re-offer pool ([`REOFFER_POOL`]).
    reoffer_free: Option<Receiver<PacketBuf>>,
    /// Every pool's give-back: thread `i`'s at `i`, thread 0's re-offer pool last.
    give_back: Vec<SyncSender<PacketBuf>>,
    pub(super) counters: HandoffCounters,
    /// The view last published (thread 0) or read (the others), and its generation.
    view: Arc<Published<ShardView>>,
    seen: u64,
    published: Option<ShardView>,
}

impl Links {
    /// This thread's shard.
    pub(super) fn me(&self) -> usize {
        self.me
    }

    /// How many threads (shards) there are.
    pub(super) fn threads(&self) -> usize {
        self.to.len()
    }

    /// The shard of connection `conn` if it is not this thread's.
    pub(super) fn shard_of_conn(
        &self,
        conn: Option<spillway_fabric::types::ConnId>,
    ) -> Option<usize> {
        let shard = shard_of(conn?, self.buckets, self.to.len());
        (shard != self.me).then_some(shard)
    }

    /// Sends `p` to thread `to`, waking it if it sleeps; `Err(p)` if its queue is full.
    #[allow(
        clippy::result_large_err,
        reason = "the parcel comes back by value, as `TrySendError` gives it back"
    )]
    pub(super) fn try_send(&mut self, to: usize, p: Parcel) -> Result<(), Parcel> {
        match self.to[to].try_send(p) {
            Ok(()) => {
                self.bells[to].ring_if_asleep();
                Ok(())
            }
            Err(TrySendError::Full(p) | TrySendError::Disconnected(p)) => Err(p),
        }
    }

    /// Sends `p` to thread `to`, waiting for room: only thread 0 does, for what the plane's
    /// reliable channel carried (no other thread ever waits for thread 0).
    pub(super) fn send(&mut self, to: usize, p: Parcel) {
        self.bells[to].ring_if_asleep();
        if self.to[to].send(p).is_ok() {
            self.bells[to].ring_if_asleep();
        }
    }

    /// Copies `frame` into a free buffer (of the re-offer pool for a `reoffer`) and sends
    /// what `make` builds of the buffer's pool and it to thread `to`; false if there was no
    /// buffer or no room (the caller counts it, or tries again).
    pub(super) fn send_frame(
        &mut self,
        to: usize,
        frame: &[u8],
        reoffer: bool,
        make: impl FnOnce(usize, PacketBuf) -> Parcel,
    ) -> bool {
        let (pool, got) = if reoffer {
            let free = self.reoffer_free.as_ref();
            (self.to.len(), free.and_then(|f| f.try_recv().ok()))
        } else {
            (self.me, self.free.try_recv().ok())
        };
        let Some(mut pkt) = got else {
            return false;
        };
        if pkt.load(frame).is_err() {
            self.recycle(pool, pkt);
            return false;
        }
        match self.try_send(to, make(pool, pkt)) {
            Ok(()) => true,
            Err(p) => {
                self.recycle_parcel(p);
                false
            }
        }
    }

    /// Hands a VM's frame to the thread of its shard; false if there was no buffer or no
    /// room. A frame read from a port is then dropped and counted (`rt.handoff.full`); one
    /// thread 0 offers again after a plane failed (`reoffer`, see [`Parcel::Frame`]) is not:
    /// its caller keeps it for a later turn.
    pub(super) fn hand_off(
        &mut self,
        to: usize,
        port: PortId,
        vnet: &Vnet,
        frame: &[u8],
        reoffer: bool,
    ) -> bool {
        let vnet = *vnet;
        let sent = self.send_frame(to, frame, reoffer, |from, pkt| Parcel::Frame {
            from,
            port,
            vnet,
            pkt,
            reoffer,
        });
        if sent {
            self.counters.handed_off += 1;
        } else if !reoffer {
            self.counters.full += 1;
        }
        sent
    }

    /// A forwarding thread: sends thread 0 a frame for `port`, which only thread 0 writes
    /// (see [`Parcel::ToPort`]); dropped and counted (`rt.handoff.full`) if there was no
    /// buffer or no room, as a full receive queue would drop it.
    fn hand_to_port(&mut self, port: PortId, vnet: &Vnet, frame: &[u8]) {
        let vnet = *vnet;
        let sent = self.send_frame(0, frame, false, |from, pkt| Parcel::ToPort {
            from,
            port,
            vnet,
            pkt,
        });
        if sent {
            self.counters.to_port += 1;
        } else {
            self.counters.full += 1;
        }
    }

    /// A forwarding thread: sends thread 0 a frame to keep (see [`Parcel::Keep`]); false
    /// (counted) if there was no buffer or no room.
    fn keep_at_zero(&mut self, port: PortId, vnet: &Vnet, frame: &[u8]) -> bool {
        let vnet = *vnet;
        let sent = self.send_frame(0, frame, false, |from, pkt| Parcel::Keep {
            from,
            port,
            vnet,
            pkt,
        });
        if !sent {
            self.counters.full += 1;
        }
        sent
    }

    /// Thread 0: every other shard's flow rows for `q` and their record counts, summed.
    pub(super) fn ask_flows(&mut self, q: &FlowQuery) -> FlowReply {
        let (mut rows, mut total) = (Vec::new(), 0);
        let me = self.me;
        for to in (0..self.to.len()).filter(|&k| k != me) {
            let (tx, rx) = sync_channel(1);
            self.send(to, Parcel::Flows(*q, tx));
            self.bells[to].ring();
            // A thread that is gone answers nothing; its rows are missing from the dump.
            if let Ok((r, n)) = rx.recv() {
                rows.extend(r);
                total += n;
            }
        }
        (rows, total)
    }

    /// Thread 0: gives every other thread's pipeline `policy` (a new epoch there too), each
    /// at its next turn.
    pub(super) fn set_policy(&mut self, policy: &Policy) {
        let me = self.me;
        for to in (0..self.to.len()).filter(|&k| k != me) {
            self.send(to, Parcel::Policy(Box::new(policy.clone())));
        }
    }

    /// Gives a buffer back to the pool it came from.
    pub(super) fn recycle(&self, from: usize, pkt: PacketBuf) {
        // The pool's channel holds every buffer the thread has: a give-back never waits.
        let _ = self.give_back[from].try_send(pkt);
    }

    pub(super) fn recycle_parcel(&self, p: Parcel) {
        match p {
            Parcel::Frame { from, pkt, .. }
            | Parcel::Keep { from, pkt, .. }
            | Parcel::ToPort { from, pkt, .. } => {
                self.recycle(from, pkt);
            }
            Parcel::Msg { .. }
            | Parcel::Ct(_)
            | Parcel::Out { .. }
            | Parcel::Flows(..)
            | Parcel::Policy(_)
            | Parcel::Lane { .. }
            | Parcel::LaneClosed { .. }
            | Parcel::LaneBack { .. }
            | Parcel::LaneFailed { .. } => {}
        }
    }

    /// The next parcel for this thread.
    pub(super) fn recv(&mut self) -> Option<Parcel> {
        self.peeked.take().or_else(|| self.inbox.try_recv().ok())
    }

    /// Before sleeping: marks the thread asleep; false if a parcel came meanwhile (then do
    /// not sleep).
    pub(super) fn prepare_sleep(&mut self) -> bool {
        self.bells[self.me].mark_asleep();
        if self.peeked.is_none() {
            match self.inbox.try_recv() {
                Ok(p) => self.peeked = Some(p),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return true,
            }
        }
        self.bells[self.me].woke();
        false
    }

    /// This thread's bell, to poll while asleep.
    pub(super) fn bell_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.bells[self.me].fd()
    }

    /// After waking.
    pub(super) fn woke(&self) {
        self.bells[self.me].woke();
    }

    /// Thread 0: publishes the control part's view if it changed.
    pub(super) fn publish_view(&mut self, view: ShardView) {
        if self.published != Some(view) {
            self.published = Some(view);
            self.view.publish(view);
        }
    }

    /// A forwarding thread: the view, if thread 0 published a new one since the last call.
    fn new_view(&mut self) -> Option<ShardView> {
        self.view.newer(&mut self.seen)
    }
}

/// Every thread's ends of the hand-off, thread `i`'s at index `i`.
pub(super) fn links(shards: usize, buckets: u16, view: ShardView) -> io::Result<Vec<Links>> {
    let bells: Vec<Arc<Bell>> = (0..shards)
        .map(|_| Bell::new().map(Arc::new))
        .collect::<io::Result<_>>()?;
    let cell = Arc::new(Published::new(view));
    let (to, inboxes): (Vec<_>, Vec<_>) = (0..shards).map(|_| sync_channel(INBOX)).unzip();
    let pool = |n: usize| {
        let (tx, rx) = sync_channel(n);
        for _ in 0..n {
            let _ = tx.try_send(PacketBuf::with_capacity(HEADROOM + FRAME_MAX));
        }
        (tx, rx)
    };
    let (mut give_back, pools): (Vec<_>, Vec<_>) = (0..shards).map(|_| pool(POOL)).unzip();
    let (reoffer_back, reoffer_free) = pool(REOFFER_POOL);
    give_back.push(reoffer_back);
    let mut reoffer_free = Some(reoffer_free);
    Ok(inboxes
        .into_iter()
        .zip(pools)
        .enumerate()
        .map(|(me, (inbox, free))| Links {
            me,
            buckets,
            inbox,
            peeked: None,
            to: to.clone(),
            bells: bells.clone(),
            free,
            reoffer_free: reoffer_free.take(),
            give_back: give_back.clone(),
            counters: HandoffCounters::default(),
            view: Arc::clone(&cell),
            seen: 0,
            published: None,
        })
        .collect())
}

/// A thread's counters, published for `ctl status` and `/metrics` to sum.
#[derive(Clone, Debug, Default)]
pub(super) struct ShardStats {
    pub(super) dpu: DpuCounters,
    pub(super) drops: Drops,
    pub(super) rt: RtCounters,
    pub(super) handoff: HandoffCounters,
    pub(super) ring: TapUringCounters,
    pub(super) frame: FrameCounters,
    pub(super) conns: ConnTableCounters,
    pub(super) vswitch_drops: DropCounters,
    pub(super) neigh: NeighCounters,
    pub(super) icmp: IcmpErrorCounters,
    pub(super) frag: FragCounters,
    /// Connections the shard's model holds.
    pub(super) conns_held: u64,
    pub(super) forwarding_allocs: u64,
    pub(super) upkeep_allocs: u64,
}

impl ShardStats {
    /// The counters of a thread's frame node, its driver counters and its ring.
    pub(super) fn of<M: DpuModel>(
        sw: &DpuSwitch<M>,
        (dpu, drops, conns_held): (&DpuCounters, &Drops, u64),
        rt: &RtCounters,
        ring: Option<&TapUringCounters>,
    ) -> ShardStats {
        let p = sw.pipeline();
        ShardStats {
            dpu: *dpu,
            drops: *drops,
            rt: *rt,
            handoff: HandoffCounters::default(),
            ring: ring.cloned().unwrap_or_default(),
            frame: *sw.counters(),
            conns: *sw.conns().counters(),
            vswitch_drops: p.drops().clone(),
            neigh: p.neigh_counters().clone(),
            icmp: p.icmp_error_counters().clone(),
            frag: p.frag_counters(),
            conns_held,
            forwarding_allocs: 0,
            upkeep_allocs: 0,
        }
    }

    /// Adds `o`'s counters to these.
    pub(super) fn add(&mut self, o: &ShardStats) {
        self.dpu.add(&o.dpu);
        self.drops = self.drops.merged(&o.drops);
        self.rt.add(&o.rt);
        self.handoff.add(&o.handoff);
        self.ring.add(&o.ring);
        self.frame.add(&o.frame);
        self.conns.add(&o.conns);
        self.vswitch_drops.merge(&o.vswitch_drops);
        self.neigh.add(&o.neigh);
        self.icmp.add(&o.icmp);
        self.frag.add(&o.frag);
        self.conns_held += o.conns_held;
        self.forwarding_allocs += o.forwarding_allocs;
        self.upkeep_allocs += o.upkeep_allocs;
    }
}

/// Thread 0's handle on the forwarding threads: their published counters, and stopping them.
#[derive(Debug)]
pub(super) struct Forwarders {
    pub(super) stats: Vec<Arc<Mutex<ShardStats>>>,
    crew: Crew,
}

impl Forwarders {
    /// The forwarding threads' counters summed (thread 0's not included).
    pub(super) fn stats(&self) -> ShardStats {
        let mut sum = ShardStats::default();
        for s in &self.stats {
            sum.add(&s.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        }
        sum
    }

    /// Connections each forwarding thread's shard held at its last report, in thread order.
    pub(super) fn conns_per_thread(&self) -> Vec<u64> {
        self.stats
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .conns_held
            })
            .collect()
    }

    /// Stops and joins every forwarding thread.
    pub(super) fn stop(&mut self) {
        self.crew.stop();
    }
}

/// What a forwarding thread is started with.
pub(super) struct ForwarderSpec {
    pub(super) sw: DpuSwitch<ShardModel<SharedResources>>,
    /// Queue k of every TAP in the ring, and the port each is.
    pub(super) queues: Vec<(PortId, OwnedFd)>,
    pub(super) vnet_hdr: bool,
    pub(super) links: Links,
    pub(super) end: ShardEnd<ShardRequest, ShardReply>,
    pub(super) clock: Clock,
}

/// Starts forwarding threads `1..`, one per spec (in shard order); `bells` are every thread's
/// (from [`links`]). A thread whose ring the kernel refuses fails the start.
pub(super) fn spawn(specs: Vec<ForwarderSpec>) -> io::Result<Forwarders> {
    let mut f = Forwarders {
        stats: Vec::new(),
        crew: Crew::new("forwarding"),
    };
    for spec in specs {
        let stats = Arc::new(Mutex::new(ShardStats::default()));
        f.stats.push(Arc::clone(&stats));
        let stop = f.crew.stop_flag();
        let (ready_tx, ready_rx) = sync_channel(1);
        let k = spec.links.me;
        let bell = Arc::clone(&spec.links.bells[k]);
        let t = std::thread::Builder::new()
            .name(format!("dpu-shard-{k}"))
            .spawn(move || match Forwarder::new(spec, stats, stop) {
                Ok(mut fwd) => {
                    let _ = ready_tx.send(Ok(()));
                    fwd.run();
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })?;
        f.crew.add(t, bell);
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other(format!("forwarding thread {k} died"))),
        }
    }
    Ok(f)
}

/// One forwarding thread: shard k of the DPU over queue k of every TAP.
struct Forwarder {
    sw: DpuSwitch<ShardModel<SharedResources>>,
    /// None when the testbed has no TAP (every VM port is one thread 0 serves): the thread
    /// then forwards what the other threads and its lanes hand it.
    ring: Option<TapUring>,
    /// The port of each file in the ring, and the file of each port.
    ports: Vec<PortId>,
    files: BTreeMap<PortId, usize>,
    /// The queues the ring reads and writes (registered in it; closed after it).
    queues: Vec<OwnedFd>,
    vnet_hdr: bool,
    counters: RtCounters,
    links: Links,
    end: ShardEnd<ShardRequest, ShardReply>,
    clock: Clock,
    stats: Arc<Mutex<ShardStats>>,
    stop: Arc<AtomicBool>,
    allocs: allocs::Upkeep,
    last_publish: Instant,
    spin: Spin,
    poll_set: Vec<libc::pollfd>,
    /// This shard's lane of each plane slot's vNIC set while a plane runs there, and the
    /// plane's number, by [`PlaneSlot::index`]: the shard's outbox goes on its active slot's
    /// ([`DpuShard::active_slot`]), its warm outbox on the other's.
    lanes: [Option<(VnicLane, u64)>; 2],
    /// Flow records of this turn from the lane.
    records: Vec<FlowRecord>,
    /// Parcels for thread 0 its queue had no room for yet, in order.
    to_zero: std::collections::VecDeque<Parcel>,
}

impl Forwarder {
    fn new(
        spec: ForwarderSpec,
        stats: Arc<Mutex<ShardStats>>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<Forwarder> {
        let (ports, queues): (Vec<PortId>, Vec<OwnedFd>) = spec.queues.into_iter().unzip();
        let fds: Vec<_> = queues.iter().map(AsFd::as_fd).collect();
        let prefix = if spec.vnet_hdr { VnetHdr::LEN } else { 0 };
        // Made on this thread: the ring takes submissions from the thread that made it only.
        let ring = if fds.is_empty() {
            None
        } else {
            Some(TapUring::new(
                &fds,
                TAP_RING_READS,
                TAP_RING_TX,
                prefix,
                FRAME_MAX,
            )?)
        };
        let files = ports.iter().enumerate().map(|(i, p)| (*p, i)).collect();
        Ok(Forwarder {
            sw: spec.sw,
            ring,
            ports,
            files,
            queues,
            vnet_hdr: spec.vnet_hdr,
            counters: RtCounters::default(),
            links: spec.links,
            end: spec.end,
            clock: spec.clock,
            stats,
            stop,
            allocs: allocs::Upkeep::default(),
            last_publish: Instant::ZERO,
            spin: Spin::default(),
            poll_set: Vec::new(),
            lanes: [None, None],
            records: Vec::with_capacity(INBOX_BATCH),
            to_zero: std::collections::VecDeque::with_capacity(TO_ZERO_MAX),
        })
    }

    fn run(&mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.clock.now();
            if let Some(v) = self.links.new_view() {
                self.sw.dpu_mut().set_view(v);
            }
            let shard = self.sw.dpu_mut().shard_mut();
            let mut busy = self.end.serve(|req| shard.serve(req)) > 0;
            busy |= self.poll_inbox(now);
            busy |= self.poll_ring(now);
            busy |= self.poll_lane(now);
            if self.sw.poll_timeout().is_some_and(|t| t <= now) {
                self.sw.dpu_mut().shard_mut().complete_due_inserts(now);
            }
            self.relay_outgoing(now);
            if let Some(Err(e)) = self.ring.as_mut().map(TapUring::enter) {
                tracing::error!(target: "spillway::run", shard = self.links.me, error = %e, "io_uring_enter failed; the forwarding thread stops");
                return;
            }
            if now.0.saturating_sub(self.last_publish.0) >= PUBLISH_NS {
                self.publish(now);
            }
            if self.spin.sleep_due(busy) {
                self.sleep(now);
            }
        }
        self.publish(self.clock.now());
    }

    /// The slot this shard's frames and outbox go to now.
    fn active(&self) -> usize {
        self.sw.dpu().shard().active_slot().index()
    }

    /// Frames the ring read on this thread's queues: this shard's go through its node, the
    /// others' to their threads.
    fn poll_ring(&mut self, now: Instant) -> bool {
        let a = self.active();
        let Forwarder {
            sw,
            ring,
            ports,
            files,
            vnet_hdr,
            counters,
            links,
            lanes,
            ..
        } = self;
        let Some(ring) = ring else {
            return false;
        };
        let n = ring.drain_frames(|file, pkt, tx| {
            counters.rx_frames += 1;
            let Some(vnet) = take_vnet(pkt, *vnet_hdr, counters) else {
                return;
            };
            let port = ports[file];
            let mut out = ShardOut {
                files,
                vnet_hdr: *vnet_hdr,
                tx: Some(tx),
                counters,
                links,
                lane: lanes[a].as_mut().map(|(l, _)| l),
                reoffer: false,
            };
            offer_frame(sw, &mut out, now, port, &vnet, pkt);
        });
        match n {
            Ok(n) => n > 0,
            Err(e) => {
                tracing::warn!(target: "spillway::run", shard = self.links.me, error = %e, "re-arming a TAP read");
                true
            }
        }
    }

    /// What the other threads handed this one.
    fn poll_inbox(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for _ in 0..INBOX_BATCH {
            let Some(p) = self.links.recv() else {
                break;
            };
            busy = true;
            let a = self.active();
            let tx = self.ring.as_mut().map(TapUring::tx);
            let mut out = ShardOut {
                files: &self.files,
                vnet_hdr: self.vnet_hdr,
                tx,
                counters: &mut self.counters,
                links: &mut self.links,
                lane: self.lanes[a].as_mut().map(|(l, _)| l),
                reoffer: false,
            };
            match p {
                Parcel::Frame {
                    from,
                    port,
                    vnet,
                    mut pkt,
                    reoffer,
                } => {
                    // Thread 0 published the view it re-offers under before it sent this.
                    if reoffer && let Some(v) = out.links.new_view() {
                        self.sw.dpu_mut().set_view(v);
                    }
                    out.reoffer = reoffer;
                    pkt.set_gso_size(gso_size(&vnet));
                    offer_frame(&mut self.sw, &mut out, now, port, &vnet, &mut pkt);
                    self.links.recycle(from, pkt);
                }
                Parcel::Flows(q, reply) => {
                    let mark = self.allocs.begin();
                    let shard = self.sw.dpu().shard();
                    let rows = flow_rows(&self.sw, shard.conns_sorted(), &q);
                    let _ = reply.send((rows, shard.conns_len()));
                    self.allocs.end(mark);
                }
                Parcel::Policy(p) => {
                    let mark = self.allocs.begin();
                    self.sw.set_policy(*p);
                    self.allocs.end(mark);
                }
                Parcel::Msg { msg, snap, slot } => self.sw.handle_msg_from(now, slot, msg, snap),
                Parcel::Ct(s) => self.sw.handle_conntrack(now, &s),
                Parcel::Lane { lane, plane, slot } => {
                    tracing::debug!(target: "spillway::run", shard = self.links.me, plane, %slot, "serving the plane's lane");
                    self.lanes[slot.index()] = Some((*lane, plane));
                }
                Parcel::LaneClosed { slot, reclaim } => {
                    if let Some((lane, plane)) = self.lanes[slot.index()].take()
                        && reclaim
                    {
                        let lane = Box::new(lane);
                        self.to_zero.push_back(Parcel::LaneBack { lane, plane });
                    }
                }
                p @ (Parcel::Out { .. }
                | Parcel::ToPort { .. }
                | Parcel::LaneFailed { .. }
                | Parcel::LaneBack { .. }
                | Parcel::Keep { .. }) => {
                    tracing::error!(target: "spillway::run", parcel = ?p, "a parcel for thread 0 reached a forwarding thread");
                    self.links.recycle_parcel(p);
                }
            }
        }
        busy
    }

    /// What the planes sent on this shard's lanes: frames of its connections through the node
    /// and on, records to the node, each taken as its slot's plane is to the shard now
    /// (active, warm or fenced); a message about no connection (an end marker, a digest, a
    /// heartbeat) to thread 0's control part, after this shard has taken every record before
    /// it. True if there was any.
    fn poll_lane(&mut self, now: Instant) -> bool {
        let mut n = 0;
        for slot in [PlaneSlot(0), PlaneSlot(1)] {
            n += self.poll_lane_of(slot, now);
        }
        n > 0
    }

    /// [`Forwarder::poll_lane`] of the plane in `slot`.
    fn poll_lane_of(&mut self, slot: PlaneSlot, now: Instant) -> usize {
        let Forwarder {
            sw,
            ring,
            files,
            vnet_hdr,
            counters,
            links,
            lanes,
            records,
            to_zero,
            ..
        } = self;
        let lane = &mut lanes[slot.index()];
        let Some((l, plane)) = lane.as_mut() else {
            return 0;
        };
        let mut out = ShardOut {
            files,
            vnet_hdr: *vnet_hdr,
            tx: ring.as_mut().map(TapUring::tx),
            counters,
            links,
            lane: None,
            reoffer: false,
        };
        let frames = l.recv_frames(RING_BATCH, |rec| {
            out.counters.from_plane += 1;
            if out.links.shard_of_conn(rec.msg.conn()).is_some() {
                out.links.counters.misrouted += 1;
                return;
            }
            let port = PortId(rec.port);
            let gso = gso_size(rec.vnet);
            let o = sw.process_from_slot(now, slot, port, rec.msg, (gso, rec.frame));
            act_from_plane(&mut out, now, o, rec.vnet, rec.frame.len());
        });
        let flow = l.recv_flow(RING_BATCH, |rec| records.push(rec));
        let n = match (frames, flow) {
            (Ok(a), Ok(b)) => a + b,
            (Err(e), _) | (_, Err(e)) => {
                let why = e.to_string();
                tracing::warn!(target: "spillway::run", shard = links.me, %slot, error = %why, "the plane's lane broke");
                to_zero.push_back(Parcel::LaneFailed { plane: *plane, why });
                *lane = None;
                1
            }
        };
        // Only an owner's conntrack changes are taken (the core's rule).
        let takes_ct = sw.takes_conntrack_from(slot);
        for rec in records.drain(..) {
            let conn = match &rec {
                FlowRecord::Msg(m, _) => m.conn(),
                FlowRecord::Ct(s) => Some(sw.conn_of_snapshot(s)),
            };
            match (rec, conn) {
                (FlowRecord::Msg(msg, snap), None) => {
                    to_zero.push_back(Parcel::Msg { msg, snap, slot });
                }
                (_, c) if links.shard_of_conn(c).is_some() => links.counters.misrouted += 1,
                (FlowRecord::Msg(m, s), _) => sw.handle_msg_from(now, slot, m, s),
                (FlowRecord::Ct(s), _) if takes_ct => sw.handle_conntrack(now, &s),
                (FlowRecord::Ct(_), _) => counters.plane_ct_fenced += 1,
            }
        }
        n
    }

    /// This shard's messages for the planes: its outbox on its active slot's lane, its warm
    /// outbox on the other's, except the control channel's, which go to thread 0 for that
    /// plane's control socket; then what waits for thread 0, while its queue has room.
    fn relay_outgoing(&mut self, now: Instant) {
        let active = self.sw.dpu().shard().active_slot();
        while let Some(o) = self.sw.poll_transmit(now) {
            self.relay_to(active, o);
        }
        while let Some(o) = self.sw.poll_warm_transmit(now) {
            self.relay_to(active.other(), o);
        }
        while let Some(p) = self.to_zero.pop_front() {
            if let Err(p) = self.links.try_send(0, p) {
                self.to_zero.push_front(p);
                break;
            }
        }
        // Thread 0 stuck for long: what waits past the bound is dropped, counted (a control
        // message lost here is retransmitted by the core's reliable channel).
        while self.to_zero.len() > TO_ZERO_MAX {
            if let Some(p) = self.to_zero.pop_back() {
                self.links.recycle_parcel(p);
            }
            self.links.counters.full += 1;
        }
        for (l, _) in self.lanes.iter_mut().flatten() {
            l.kick();
        }
    }

    /// A message of this shard's for the plane in `slot`.
    fn relay_to(&mut self, slot: PlaneSlot, o: Outgoing) {
        match (&o, self.lanes[slot.index()].as_mut()) {
            (
                Outgoing::Msg {
                    channel: Channel::Control,
                    ..
                },
                _,
            ) => self.to_zero.push_back(Parcel::Out { o, slot }),
            (_, Some((l, _))) => {
                l.send_outgoing_flow(&o);
            }
            // No plane: the model's fail-open (or the warm plane's restart) has the message
            // covered, as on thread 0.
            (_, None) => {}
        }
    }

    fn publish(&mut self, now: Instant) {
        let mark = self.allocs.begin();
        self.last_publish = now;
        self.sw.expire(now);
        let shard = self.sw.dpu().shard();
        let mut s = ShardStats::of(
            &self.sw,
            (shard.counters(), shard.drops(), shard.conns_len() as u64),
            &self.counters,
            self.ring.as_ref().map(TapUring::counters),
        );
        s.handoff = self.links.counters.clone();
        s.forwarding_allocs = self.allocs.forwarding();
        s.upkeep_allocs = self.allocs.upkeep();
        *self
            .stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
        self.allocs.end(mark);
    }

    fn sleep(&mut self, now: Instant) {
        if self.ring.as_ref().is_some_and(TapUring::has_frames) || !self.links.prepare_sleep() {
            return;
        }
        // Each lane's doorbell armed; a lane with records already waiting calls the sleep off.
        let mut quiet = true;
        for (l, _) in self.lanes.iter_mut().flatten() {
            quiet &= l.prepare_sleep();
        }
        if !quiet {
            for (l, _) in self.lanes.iter_mut().flatten() {
                l.woke();
            }
            self.links.woke();
            return;
        }
        let next = self
            .sw
            .poll_timeout()
            .map_or(10_000_000, |t| t.0.saturating_sub(now.0));
        let timeout_ms = (next / 1_000_000).clamp(0, 10) as i32;
        let readable = |fd: i32| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        self.poll_set.clear();
        self.poll_set
            .extend(self.queues.iter().map(|q| readable(q.as_raw_fd())));
        self.poll_set
            .push(readable(self.links.bell_fd().as_raw_fd()));
        for (l, _) in self.lanes.iter().flatten() {
            self.poll_set.push(readable(l.bell_fd().as_raw_fd()));
        }
        // SAFETY: `poll_set` holds `len` initialised `pollfd`s of fds this thread owns (its
        // queues, its bell, its lanes' doorbells), none closed during the call; `poll` writes
        // only `revents`. Every source is polled again after waking, so the result is not
        // needed.
        let _ = unsafe {
            libc::poll(
                self.poll_set.as_mut_ptr(),
                self.poll_set.len() as libc::nfds_t,
                timeout_ms,
            )
        };
        for (l, _) in self.lanes.iter_mut().flatten() {
            l.woke();
        }
        self.links.woke();
    }
}

/// Sends on what a DPU node made of a frame from the plane (`len` bytes as it came).
pub(super) fn act_from_plane(
    out: &mut impl Egress,
    now: Instant,
    o: spillway_fabric::frame::Outcome<'_>,
    vnet: &Vnet,
    len: usize,
) {
    use spillway_fabric::frame::Outcome;
    match o {
        Outcome::Forward {
            port: to,
            bytes,
            generated,
        } => {
            let vnet = if generated { &PLAIN_VNET } else { vnet };
            out.forward_bytes(now, to, vnet, bytes);
        }
        Outcome::Drop(why) => {
            tracing::debug!(target: "spillway::drop", ?why, len, "the DPU dropped a frame from the plane");
        }
        other => {
            tracing::error!(target: "spillway::run", outcome = ?other, "a DPU outcome only the plane has");
        }
    }
}

/// Where a forwarding thread's frames go: out of its own queue of a TAP, or to the plane on
/// its shard's lane.
struct ShardOut<'a> {
    files: &'a BTreeMap<PortId, usize>,
    vnet_hdr: bool,
    tx: Option<&'a mut TapTx>,
    counters: &'a mut RtCounters,
    links: &'a mut Links,
    /// The lane of the slot the shard steers to, if a plane runs there.
    lane: Option<&'a mut VnicLane>,
    /// The frame is one thread 0 offers again: not kept a second time (see
    /// [`Egress::keep`]).
    reoffer: bool,
}

impl ShardOut<'_> {
    fn count(&mut self, written: bool) {
        if written {
            self.counters.tx_frames += 1;
        } else {
            self.counters.tx_errors += 1;
        }
    }
}

impl Egress for ShardOut<'_> {
    fn forward_buf(&mut self, _now: Instant, port: PortId, vnet: &Vnet, pkt: &mut PacketBuf) {
        let (Some(&file), Some(tx)) = (self.files.get(&port), self.tx.as_deref_mut()) else {
            // Not a TAP: a port thread 0 serves (or none, which thread 0 counts).
            self.links.hand_to_port(port, vnet, pkt.data());
            return;
        };
        let hdr = tap_hdr(vnet);
        let hdr: &[u8] = if self.vnet_hdr { &hdr } else { &[] };
        let r = tx.send_in_place(file, hdr, pkt) || tx.write(file, [hdr, pkt.data()]);
        self.count(r);
    }

    fn forward_bytes(&mut self, _now: Instant, port: PortId, vnet: &[u8], frame: &[u8]) {
        let (Some(&file), Some(tx)) = (self.files.get(&port), self.tx.as_deref_mut()) else {
            let vnet = Vnet::try_from(vnet).unwrap_or(PLAIN_VNET);
            self.links.hand_to_port(port, &vnet, frame);
            return;
        };
        let hdr = tap_hdr(vnet);
        let hdr: &[u8] = if self.vnet_hdr { &hdr } else { &[] };
        let r = tx.write(file, [hdr, frame]);
        self.count(r);
    }

    fn steer(&mut self, msg: &Msg, port: PortId, vnet: &Vnet, frame: &[u8]) -> bool {
        self.lane
            .as_deref_mut()
            .is_some_and(|l| l.send_frame(msg, port.0, vnet, frame))
    }

    fn hand_off(&mut self, to: usize, port: PortId, vnet: &Vnet, frame: &[u8]) {
        self.links.hand_off(to, port, vnet, frame, false);
    }

    fn keep(&mut self, port: PortId, vnet: &Vnet, frame: &[u8]) -> bool {
        self.lane.is_none() && !self.reoffer && self.links.keep_at_zero(port, vnet, frame)
    }

    fn counters(&mut self) -> &mut RtCounters {
        self.counters
    }
}

/// The DPU process's frame node on thread 0 and, with `f.dpu.shards > 1`, its links to the
/// forwarding threads, which this starts: shard k's thread over queue k of every TAP port in
/// `ports`.
pub(super) fn start(
    f: &FabricParams,
    policy: &Policy,
    ports: &[Port],
    vnet_hdr: bool,
    clock: Clock,
) -> Result<(Switch, Option<(Links, Forwarders)>), String> {
    // Each thread's node with its share of the tables.
    fn node<M: DpuModel>(dpu: M, policy: &Policy, n: usize) -> Result<DpuSwitch<M>, String> {
        let (config, conns_max) = shard_capacities(n);
        DpuSwitch::with_model(dpu, policy.clone(), config, conns_max)
            .map_err(|e| format!("pipeline: {e}"))
    }
    let hw = || Resources::new(f, Box::new(EmulatedHardware::new(f)));
    let n = f.dpu.shards.max(1) as usize;
    if n == 1 {
        let dpu = DpuNode::with_resources(f, DpuResources::Own(hw()));
        return Ok((node(dpu, policy, n)?, None));
    }
    let res = SharedResources::new(hw());
    let view = DpuControl::new(f).view();
    let mut all = links(n, f.dpu.redirect_buckets, view).map_err(|e| format!("eventfd: {e}"))?;
    let others = all.split_off(1);
    let mine = all.pop().expect("links for thread 0");
    let mut transport = ThreadShards::new();
    let mut specs = Vec::new();
    for l in others {
        let bell = Arc::clone(&l.bells[l.me]);
        let end = transport.add(move || bell.ring());
        let k = l.me;
        let queues = ports
            .iter()
            .filter_map(|p| match &p.io {
                PortIo::Tap(tap) => Some((p.id, tap)),
                PortIo::Shm(_) | PortIo::VhostUser(_) => None,
            })
            .map(|(id, tap)| {
                let fd = tap
                    .as_fd(k)
                    .ok_or_else(|| format!("TAP {} has no queue {k}", tap.name()))?;
                let fd = fd
                    .try_clone_to_owned()
                    .map_err(|e| format!("TAP {} queue {k}: {e}", tap.name()))?;
                Ok((id, fd))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let shard = DpuShard::with_resources(f, res.share());
        specs.push(ForwarderSpec {
            sw: node(
                ShardModel::placed(shard, view, (k, n, f.dpu.redirect_buckets)),
                policy,
                n,
            )?,
            queues,
            vnet_hdr,
            links: l,
            end,
            clock,
        });
    }
    let dpu = DpuNode::with_remote(f, DpuResources::Shared(res), Box::new(transport));
    let sw = node(dpu, policy, n)?;
    let fwd = spawn(specs).map_err(|e| format!("forwarding threads: {e}"))?;
    tracing::info!(target: "spillway::run", threads = n, "forwarding on one thread per shard");
    Ok((sw, Some((mine, fwd))))
}

#[cfg(test)]
mod tests {
    use spillway_fabric::dpu::DpuControl;
    use spillway_fabric::params::FabricParams;
    use spillway_fabric::types::ConnId;

    use super::*;

    fn two() -> (Links, Links) {
        let f = FabricParams::default();
        let mut l = links(2, f.dpu.redirect_buckets, DpuControl::new(&f).view()).expect("links");
        let b = l.pop().expect("thread 1");
        (l.pop().expect("thread 0"), b)
    }

    #[test]
    fn a_frame_for_a_port_of_thread_0_goes_there_and_a_full_queue_drops_it_counted() {
        let (mut zero, mut one) = two();
        let frame: Vec<u8> = (0..90u8).collect();
        let vnet = [3u8; VnetHdr::LEN];
        one.hand_to_port(PortId(2), &vnet, &frame);
        match zero.recv() {
            Some(Parcel::ToPort {
                from,
                port,
                vnet: v,
                pkt,
            }) => {
                assert_eq!((from, port, v), (1, PortId(2), vnet));
                assert_eq!(pkt.data(), &frame[..]);
                zero.recycle(from, pkt);
            }
            other => panic!("{other:?}"),
        }
        // Thread 0 takes nothing: its queue fills, then what cannot go is dropped, counted,
        // and every buffer stays with its pool.
        for _ in 0..INBOX + 10 {
            one.hand_to_port(PortId(2), &vnet, &frame);
        }
        let sent = POOL.min(INBOX) as u64;
        assert_eq!(one.counters.to_port, 1 + sent);
        assert_eq!(one.counters.full, (INBOX + 10) as u64 - sent);
        let mut n = 0;
        while let Some(p) = zero.recv() {
            zero.recycle_parcel(p);
            n += 1;
        }
        assert_eq!(n, sent as usize);
    }

    #[test]
    fn a_handed_off_frame_arrives_whole_and_its_buffer_goes_home() {
        let (mut a, mut b) = two();
        let frame: Vec<u8> = (0..200u8).collect();
        let vnet = [7u8; VnetHdr::LEN];
        a.hand_off(1, PortId(3), &vnet, &frame, false);
        assert_eq!(a.counters.handed_off, 1);
        match b.recv() {
            Some(Parcel::Frame {
                from,
                port,
                vnet: v,
                pkt,
                reoffer: false,
            }) => {
                assert_eq!((from, port, v), (0, PortId(3), vnet));
                assert_eq!(pkt.data(), &frame[..]);
                b.recycle(from, pkt);
            }
            other => panic!("{other:?}"),
        }
        assert!(b.recv().is_none());
        // Every buffer is back: a full pool's worth can be handed off again.
        for _ in 0..POOL {
            a.hand_off(1, PortId(3), &vnet, &frame, false);
        }
        assert_eq!(
            (a.counters.handed_off, a.counters.full),
            (1 + POOL as u64, 0)
        );
    }

    #[test]
    fn a_sender_out_of_buffers_drops_and_counts_and_never_waits() {
        let (mut a, mut b) = two();
        let frame = [0u8; 64];
        for _ in 0..POOL + 3 {
            a.hand_off(1, PortId(1), &PLAIN_VNET, &frame, false);
        }
        assert_eq!((a.counters.handed_off, a.counters.full), (POOL as u64, 3));
        // The receiver takes them and gives the buffers back; the sender can send again.
        let mut n = 0;
        while let Some(p) = b.recv() {
            n += 1;
            b.recycle_parcel(p);
        }
        assert_eq!(n, POOL);
        a.hand_off(1, PortId(1), &PLAIN_VNET, &frame, false);
        assert_eq!(a.counters.handed_off, POOL as u64 + 1);
    }

    #[test]
    fn a_frame_too_big_for_a_buffer_is_dropped_and_counted() {
        let (mut a, _b) = two();
        a.hand_off(1, PortId(1), &PLAIN_VNET, &vec![0u8; FRAME_MAX + 1], false);
        assert_eq!((a.counters.handed_off, a.counters.full), (0, 1));
    }

    #[test]
    fn connections_are_routed_by_bucket_and_a_thread_keeps_its_own() {
        let (a, b) = two();
        let f = FabricParams::default();
        for c in (0..64).map(ConnId) {
            let shard = shard_of(c, f.dpu.redirect_buckets, 2);
            let (to_a, to_b) = (a.shard_of_conn(Some(c)), b.shard_of_conn(Some(c)));
            assert_eq!(to_a, (shard != 0).then_some(shard), "{c:?}");
            assert_eq!(to_b, (shard != 1).then_some(shard), "{c:?}");
        }
        assert_eq!(
            a.shard_of_conn(None),
            None,
            "a frame of no connection stays"
        );
    }

    #[test]
    fn a_published_view_reaches_the_other_thread_once() {
        let (mut a, mut b) = two();
        let mut v = a.view.get();
        assert_eq!(b.new_view(), None, "nothing published yet");
        v.quota = 17;
        a.publish_view(v);
        a.publish_view(v);
        assert_eq!(b.new_view(), Some(v));
        assert_eq!(b.new_view(), None, "taken once");
    }

    #[test]
    fn a_thread_that_said_it_sleeps_is_woken_by_a_parcel() {
        let (mut a, mut b) = two();
        assert!(b.prepare_sleep(), "nothing waiting: it may sleep");
        let hb = Msg::Heartbeat {
            workers: 1,
            util: 0.0,
        };
        let slot = PlaneSlot(0);
        a.try_send(
            1,
            Parcel::Msg {
                msg: hb,
                snap: None,
                slot,
            },
        )
        .expect("room");
        assert_eq!(
            b.bells[1].drain().expect("eventfd"),
            1,
            "the sender rang the sleeper's bell"
        );
        assert!(!b.prepare_sleep(), "a parcel is waiting");
        assert!(
            matches!(b.recv(), Some(Parcel::Msg { .. })),
            "the peeked parcel comes first"
        );
    }
}
