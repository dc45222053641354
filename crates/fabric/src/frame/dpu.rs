//! The DPU side of a frame: [`DpuSwitch`], over the whole DPU model ([`DpuNode`]) or over one
//! shard of it ([`ShardModel`]).

use spillway_vswitch::pipeline::{Pipeline, PipelineConfig, PipelineError};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PacketBuf, PortId};

use spillway_vswitch::conntrack::CtSnapshot;

use super::{FrameDrop, Model, Outcome, Outgoing, SwitchCore, gso_segments};
use crate::dpu::{
    Command, DpuConn, DpuNode, DpuShard, FabricEvent, Resources, ResourcesHandle, Sender, ShardView,
};
use crate::params::FabricParams;
use crate::records::Role;
use crate::types::{ConnId, Dest, Kind, Msg, PlaneSlot, Train, Transmit};

/// The DPU model a [`DpuSwitch`] joins to its pipeline: what a frame asks of it.
pub trait DpuModel {
    /// A plane runs (it could hold a connection the model does not).
    fn has_plane(&self) -> bool;
    /// The model's record of `conn`.
    fn conn(&self, conn: ConnId) -> Option<&DpuConn>;
    /// A train from a VM or the uplink.
    fn handle_train(&mut self, now: Instant, t: &Train);
    /// Packets the last input delivered at once.
    fn delivered_last(&self) -> u32;
    /// A message from the plane.
    fn handle_msg(&mut self, now: Instant, msg: Msg);
    /// The next message for the plane.
    fn poll_transmit(&mut self) -> Option<Transmit>;
    /// When the model's next timer is due.
    fn poll_timeout(&self) -> Option<Instant>;
    /// The shard that serves `conn` when it is not this model (a driver with a thread per
    /// shard hands the frame to that shard's thread); `None` when this model serves it.
    fn served_elsewhere(&self, conn: ConnId) -> Option<usize>;
    /// What the plane in `slot` is to the model now ([`Sender`]).
    fn sender(&self, slot: PlaneSlot) -> Sender;
    /// A message from the plane in `slot`, taken as its [`DpuModel::sender`] is now.
    fn handle_msg_from(&mut self, now: Instant, slot: PlaneSlot, msg: Msg);
    /// The next message for the warm standby plane, in the slot other than the active one.
    fn poll_warm_transmit(&mut self) -> Option<Transmit>;
}

impl<R: ResourcesHandle> DpuModel for DpuNode<R> {
    fn has_plane(&self) -> bool {
        self.phase().has_plane()
    }
    fn conn(&self, conn: ConnId) -> Option<&DpuConn> {
        DpuNode::conn(self, conn)
    }
    fn handle_train(&mut self, now: Instant, t: &Train) {
        DpuNode::handle_train(self, now, t);
    }
    fn delivered_last(&self) -> u32 {
        DpuNode::delivered_last(self)
    }
    fn handle_msg(&mut self, now: Instant, msg: Msg) {
        DpuNode::handle_msg(self, now, msg);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        DpuNode::poll_transmit(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        DpuNode::poll_timeout(self)
    }
    fn served_elsewhere(&self, conn: ConnId) -> Option<usize> {
        let k = self.shard_of(conn);
        (k >= self.shard_count()).then_some(k)
    }
    fn sender(&self, slot: PlaneSlot) -> Sender {
        DpuNode::sender(self, slot)
    }
    fn handle_msg_from(&mut self, now: Instant, slot: PlaneSlot, msg: Msg) {
        DpuNode::handle_msg_from(self, now, slot, msg);
    }
    fn poll_warm_transmit(&mut self) -> Option<Transmit> {
        DpuNode::poll_warm_transmit(self)
    }
}

/// One shard of the DPU model with the control part's latest [`ShardView`]: what a forwarding
/// thread of a driver with a thread per shard joins to its own pipeline (ADR 0011). The driver
/// gives it the frames and the plane's messages of the shard's connections
/// ([`crate::dpu::shard_of`] of [`Msg::conn`]); the plane's lifecycle
/// replies go to the control part, and the control part's requests reach the shard through the
/// driver's [`crate::dpu::Shards`].
#[derive(Debug)]
pub struct ShardModel<R: ResourcesHandle> {
    shard: DpuShard<R>,
    view: ShardView,
    /// Which shard this is, of how many, over how many buckets: with it, a frame of another
    /// shard's connection comes out as [`Outcome::Elsewhere`].
    place: Option<(usize, usize, u16)>,
}

impl<R: ResourcesHandle> ShardModel<R> {
    /// `shard`, seeing the lifecycle as `view`, serving whatever it is given (its driver
    /// routes every frame to its shard's thread itself).
    pub fn new(shard: DpuShard<R>, view: ShardView) -> ShardModel<R> {
        ShardModel {
            shard,
            view,
            place: None,
        }
    }
    /// The same, as shard `index` of `shards` over `redirect_buckets` buckets: the node says
    /// which frames are another shard's ([`Outcome::Elsewhere`]) from its own parse.
    pub fn placed(
        shard: DpuShard<R>,
        view: ShardView,
        (index, shards, redirect_buckets): (usize, usize, u16),
    ) -> ShardModel<R> {
        ShardModel {
            shard,
            view,
            place: Some((index, shards, redirect_buckets)),
        }
    }
    /// The control part's new view, after a lifecycle step.
    pub fn set_view(&mut self, view: ShardView) {
        self.view = view;
    }
    /// The shard.
    pub fn shard(&self) -> &DpuShard<R> {
        &self.shard
    }
    /// The shard, for the control part's requests.
    pub fn shard_mut(&mut self) -> &mut DpuShard<R> {
        &mut self.shard
    }
}

impl<R: ResourcesHandle> DpuModel for ShardModel<R> {
    fn has_plane(&self) -> bool {
        self.view.phase.has_plane()
    }
    fn conn(&self, conn: ConnId) -> Option<&DpuConn> {
        self.shard.conn(conn)
    }
    fn handle_train(&mut self, now: Instant, t: &Train) {
        self.shard.handle_train(now, t, self.view);
    }
    fn delivered_last(&self) -> u32 {
        self.shard.delivered_last()
    }
    fn handle_msg(&mut self, now: Instant, msg: Msg) {
        self.shard.handle_msg(now, msg, self.view);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.shard.poll_transmit()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.shard.poll_timeout()
    }
    fn served_elsewhere(&self, conn: ConnId) -> Option<usize> {
        let (index, shards, buckets) = self.place?;
        let k = crate::dpu::shard_of(conn, buckets, shards);
        (k != index).then_some(k)
    }
    fn sender(&self, slot: PlaneSlot) -> Sender {
        self.shard.sender(slot)
    }
    /// A message about one of the shard's connections: the driver sends the rest (lifecycle
    /// replies, digests, end markers) to the control part's thread, so one that names none
    /// here is dropped and counted (`dpu.fenced`).
    fn handle_msg_from(&mut self, now: Instant, slot: PlaneSlot, msg: Msg) {
        let sender = self.sender(slot);
        self.shard.handle_msg_as(now, sender, msg, self.view);
    }
    fn poll_warm_transmit(&mut self) -> Option<Transmit> {
        self.shard.poll_warm_transmit()
    }
}

/// The joining rules see any DPU model through [`DpuModel`].
impl<M: DpuModel> Model for M {
    fn role(&self, conn: ConnId) -> Option<Role> {
        DpuModel::conn(self, conn).map(|c| c.role)
    }
    fn handle_msg(&mut self, now: Instant, msg: Msg) {
        DpuModel::handle_msg(self, now, msg);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        DpuModel::poll_transmit(self)
    }
}

/// A datagram (anything but TCP) of a connection the classifier knows but no model holds (its
/// first packet was dropped at a limit, or lost with a plane that failed before its mirror
/// arrived) opens it again, as conntrack makes state from any UDP datagram: otherwise every
/// later datagram of the flow would be dropped for want of state until the classifier forgot
/// it. A TCP segment does not: without a SYN there is nothing to open. The caller knows that
/// no plane holds it either.
fn reopen_if_stateless(dpu: &impl DpuModel, t: &mut Train, key: &spillway_wire::FlowKey) {
    if t.kind == Kind::Data
        && key.proto != spillway_wire::ip_proto::TCP
        && dpu.conn(t.conn).is_none()
    {
        t.kind = Kind::Open;
    }
}

/// What became of a frame, before its bytes are lent out: [`DpuSwitch::process`] and
/// [`DpuSwitch::process_in_place`] differ only in whose buffer those are.
enum Decided {
    Forward(PortId),
    Steer(Msg),
    Elsewhere(usize),
    Drop(FrameDrop),
}

/// The DPU with real frames: the [`DpuNode`] model, the DPU's vSwitch [`Pipeline`] (its SoC's
/// slow path, which also stands for what the hardware fast path does to a frame), and the
/// classifier's [`ConnTable`](super::ConnTable).
///
/// Inputs: [`DpuSwitch::process`] (a frame from a VM port or the uplink), [`DpuSwitch::process_from_plane`]
/// (a frame the plane sent back or punted), [`DpuSwitch::handle_msg`] and
/// [`DpuSwitch::handle_conntrack`] (the plane's flow and control records), and the model's own
/// lifecycle inputs through [`DpuSwitch::dpu_mut`] (timers, the plane's process). Outputs:
/// each frame's [`Outcome`], then [`DpuSwitch::poll_transmit`], [`DpuSwitch::poll_command`],
/// [`DpuSwitch::poll_event`], in that order (see the [module](super) for the polling order).
///
/// `M` is the model: the whole [`DpuNode`] (its own resources by default), or a
/// [`ShardModel`] for one forwarding thread of a driver that shards.
#[derive(Debug)]
pub struct DpuSwitch<M: DpuModel = DpuNode<Resources>> {
    dpu: M,
    sw: SwitchCore,
}

impl DpuSwitch {
    /// A DPU with fabric parameters `f`, vSwitch `policy` and `config`, remembering at most
    /// `conns_max` connections in its classifier.
    pub fn new(
        f: &FabricParams,
        policy: Policy,
        config: PipelineConfig,
        conns_max: usize,
    ) -> Result<DpuSwitch, PipelineError> {
        DpuSwitch::with_model(DpuNode::new(f), policy, config, conns_max)
    }
}

impl<M: DpuModel> DpuSwitch<M> {
    /// The DPU model `dpu` with vSwitch `policy` and `config`, remembering at most `conns_max`
    /// connections in its classifier.
    pub fn with_model(
        dpu: M,
        policy: Policy,
        config: PipelineConfig,
        conns_max: usize,
    ) -> Result<DpuSwitch<M>, PipelineError> {
        Ok(DpuSwitch {
            dpu,
            sw: SwitchCore::new(Pipeline::new(policy, config)?, conns_max),
        })
    }

    /// The model.
    pub fn dpu(&self) -> &M {
        &self.dpu
    }

    /// The model, for its lifecycle inputs (timers, the plane's process, holds). The messages
    /// they cause come out of [`DpuSwitch::poll_transmit`], not the model's own queue.
    pub fn dpu_mut(&mut self) -> &mut M {
        &mut self.dpu
    }

    switch_api!(dpu, "plane");

    /// A frame from one of the DPU's ports: a VM port, or the uplink (VXLAN for our VTEP, whose
    /// tenant is its VNI's); `gso_size` is its segment size if it is a GSO frame (0 if not).
    /// ARP and neighbour discovery go to the pipeline's responder, with no connection for the
    /// model to place; every other frame is offered to the model as a train of as many packets
    /// as it has segments, and then:
    ///
    /// - served by the DPU (fast or slow path) in full: it runs through the pipeline and is
    ///   forwarded (or dropped by it); a TCP state change of a connection the DPU owns is
    ///   mirrored to the plane's copy;
    /// - steered to the plane: it leaves as it came, with the model's message;
    /// - admitted only in part (a GSO frame): dropped whole;
    /// - refused by a limit, or of a connection nobody knows: dropped. When that was the
    ///   connection's close, this pipeline's entry (a copy, or the state of a close the plane
    ///   carried) is forgotten: it would refuse the tuple's next SYN.
    ///
    /// A forwarded frame's bytes are the node's buffer (the frame is copied in);
    /// [`DpuSwitch::process_in_place`] works on the caller's buffer instead.
    pub fn process<'a>(
        &'a mut self,
        now: Instant,
        port: PortId,
        gso_size: u16,
        frame: &'a [u8],
    ) -> Outcome<'a> {
        if self.sw.pkt.load(frame).is_err() {
            return self.sw.drop(FrameDrop::Parse);
        }
        match self.decide(now, port, gso_size) {
            Decided::Forward(out) => self.sw.forwarded(out),
            Decided::Steer(msg) => Outcome::Steer { msg },
            Decided::Elsewhere(shard) => Outcome::Elsewhere { shard },
            Decided::Drop(d) => Outcome::Drop(d),
        }
    }

    /// [`DpuSwitch::process`] of the frame in the caller's buffer `pkt` (its GSO size set, as
    /// a driver that reads a TAP or virtio queue into its own buffers sets it): the pipeline
    /// rewrites it there, and a forwarded frame's bytes are `pkt`'s, so a driver that reads
    /// into and writes from its own buffers copies the frame nowhere in between. A steered
    /// frame is untouched: `pkt` holds it as it came.
    pub fn process_in_place<'a>(
        &'a mut self,
        now: Instant,
        port: PortId,
        pkt: &'a mut PacketBuf,
    ) -> Outcome<'a> {
        // The node's own buffer is set aside for the call, not copied: a swap of two boxes.
        std::mem::swap(&mut self.sw.pkt, pkt);
        let decided = self.decide(now, port, self.sw.pkt.gso_size());
        std::mem::swap(&mut self.sw.pkt, pkt);
        match decided {
            Decided::Forward(out) => Outcome::Forward {
                port: out,
                bytes: pkt.data(),
                generated: pkt.is_generated(),
            },
            Decided::Steer(msg) => Outcome::Steer { msg },
            Decided::Elsewhere(shard) => Outcome::Elsewhere { shard },
            Decided::Drop(d) => Outcome::Drop(d),
        }
    }

    /// The connection a conntrack snapshot from the plane is of (whose shard adopts it).
    pub fn conn_of_snapshot(&self, snap: &spillway_vswitch::conntrack::CtSnapshot) -> ConnId {
        self.sw.conns.id_of(snap.zone, &snap.orig)
    }

    /// What [`DpuSwitch::process`] does to the frame in the node's buffer; drops are counted.
    fn decide(&mut self, now: Instant, port: PortId, gso_size: u16) -> Decided {
        // Decapsulation by where the frame came from: VXLAN only on the uplink; a VM port's
        // UDP to the VXLAN port is tenant traffic, not our underlay.
        let parsed = match self.sw.parse_loaded(port) {
            Ok(p) => p,
            Err(d) => return Decided::Drop(d),
        };
        let Some(tenant) = self.sw.tenant_of(port, &parsed) else {
            return Decided::Drop(self.sw.count(FrameDrop::NoTenant));
        };
        if spillway_vswitch::neigh::claims(&parsed) {
            // The SoC's: the pipeline answers in place (out of this port) or consumes it.
            self.sw.counters.neigh_frames += 1;
            return match self.sw.run(now, port, (0, &parsed), None) {
                (Ok(out), _) => Decided::Forward(out),
                (Err(d), _) => Decided::Drop(d),
            };
        }
        let headers = parsed.innermost();
        let Some(key) = headers.key else {
            return Decided::Drop(self.sw.count(FrameDrop::NonIp));
        };
        // Another thread's connection: named from this parse, before anything is learnt.
        let conn = self.sw.conns.id_of(tenant, &key);
        if let Some(shard) = self.dpu.served_elsewhere(conn) {
            return Decided::Elsewhere(shard);
        }
        let frame_len = self.sw.pkt.len();
        let len = frame_len as u32;
        let flags = headers.tcp_flags;
        let mut train = self
            .sw
            .conns
            .classify_as(now, conn, tenant, &key, (flags, len), Dest::Vm);
        if !self.dpu.has_plane() {
            // No plane that could hold the connection: whether the model does is the truth.
            reopen_if_stateless(&self.dpu, &mut train, &key);
        }
        let segs = gso_segments(gso_size, frame_len, usize::from(headers.payload_offset));
        train.packets = segs;
        train.packet_bytes = len.div_ceil(segs);
        self.dpu.handle_train(now, &train);
        let delivered = self.dpu.delivered_last();
        // Forward before queueing the model's messages: a state sync this frame caused then
        // carries the conntrack entry as this frame left it, not one packet behind.
        let mut result = None;
        if delivered == segs {
            let role = self.dpu.conn(train.conn).map(|c| c.role);
            let linked = self.dpu.has_plane();
            let watch = self.sw.watch(now, role, linked, tenant, Some(key));
            let (r, changed) = self.sw.run(now, port, (gso_size, &parsed), watch);
            result = Some((r, changed));
        } else if train.kind == Kind::Close && delivered == 0 {
            self.sw.pipeline.forget_conn(now, tenant, &key);
        }
        let steer = self.sw.drain(&mut self.dpu, Some(train.conn));
        match (result, steer) {
            (Some((r, changed)), _) => {
                self.sw.seal(now, changed);
                match r {
                    Ok(out) => Decided::Forward(out),
                    Err(d) => Decided::Drop(d),
                }
            }
            (None, steer) => {
                self.sw.seal(now, None);
                match steer {
                    Some(msg) => Decided::Steer(msg),
                    None if delivered > 0 => Decided::Drop(self.sw.count(FrameDrop::PartialGso)),
                    None => Decided::Drop(self.sw.count(FrameDrop::Fabric)),
                }
            }
        }
    }

    /// A frame the plane sent on the phy vNIC with `msg`, for port `port`:
    ///
    /// - `Packets`: the plane processed it; the model sends it on (to the VM or the wire) as
    ///   it is, or drops it at a limit;
    /// - `Punt`: the plane had no state for its connection; the DPU's slow path takes it as
    ///   the owner would, through this pipeline, if the model knows the connection.
    pub fn process_from_plane<'a>(
        &'a mut self,
        now: Instant,
        port: PortId,
        msg: Msg,
        gso_size: u16,
        frame: &'a [u8],
    ) -> Outcome<'a> {
        self.take_from_plane(now, (port, gso_size, frame), msg, |m, now, msg| {
            m.handle_msg(now, msg)
        })
    }

    /// [`DpuSwitch::process_from_plane`], the model taking the message with `take`.
    fn take_from_plane<'a>(
        &'a mut self,
        now: Instant,
        (port, gso_size, frame): (PortId, u16, &'a [u8]),
        msg: Msg,
        take: impl FnOnce(&mut M, Instant, Msg),
    ) -> Outcome<'a> {
        let Some(mut t) = msg.train().copied() else {
            return self.sw.drop(FrameDrop::Protocol);
        };
        let mut msg = msg;
        // A punted frame goes through this pipeline: parsed once, for that and for the key,
        // after it is copied out of the plane's ring (the plane could rewrite it there between
        // the parse and the pipeline).
        let parsed = match msg {
            Msg::Punt(_) => match self.sw.load_and_parse(port, frame) {
                Ok(p) => Some(p),
                Err(d) => return Outcome::Drop(d),
            },
            _ => None,
        };
        if let Some(key) = parsed.as_ref().and_then(|p| p.innermost().key) {
            // The plane has no state for it; if the DPU has none either, nobody does.
            reopen_if_stateless(&self.dpu, &mut t, &key);
            msg = Msg::Punt(t);
        }
        take(&mut self.dpu, now, msg);
        let served = self.dpu.delivered_last() == t.packets;
        self.sw.drain(&mut self.dpu, None);
        let r = match &parsed {
            Some(p) if served => Some(self.sw.run(now, port, (gso_size, p), None).0),
            _ => None,
        };
        self.sw.seal(now, None);
        match (msg, r) {
            (Msg::Packets(_), _) if served => Outcome::Forward {
                port,
                bytes: frame,
                generated: false,
            },
            (_, Some(Ok(out))) => self.sw.forwarded(out),
            (_, Some(Err(d))) => Outcome::Drop(d),
            _ => self.sw.drop(FrameDrop::Fabric),
        }
    }
}

impl<R: ResourcesHandle> DpuSwitch<DpuNode<R>> {
    /// The model's next command (start or stop the plane's process).
    pub fn poll_command(&mut self) -> Option<Command> {
        self.dpu.poll_command()
    }

    /// The model's next lifecycle event.
    pub fn poll_event(&mut self) -> Option<FabricEvent> {
        self.dpu.poll_event()
    }
}

impl<M: DpuModel> DpuSwitch<M> {
    /// A flow-vNIC or control message from the plane in `slot`, with the conntrack snapshot
    /// it carried: the model takes it as its sender is now ([`DpuNode::sender`]). The active
    /// plane's snapshots are adopted as [`DpuSwitch::handle_msg`] adopts them. A fenced
    /// plane's is adopted only where the model took its state as the owner's (an orphan
    /// nobody else held, newer than the DPU's record): a fenced plane is never the owner, so
    /// its snapshot must not overwrite the DPU's copy of a connection the current plane owns.
    pub fn handle_msg_from(
        &mut self,
        now: Instant,
        slot: PlaneSlot,
        msg: Msg,
        snap: Option<CtSnapshot>,
    ) {
        let mut from = FromSlot {
            dpu: &mut self.dpu,
            slot,
        };
        if from.dpu.sender(slot) != Sender::Fenced {
            self.sw.handle_msg(&mut from, now, msg, snap);
            return;
        }
        self.sw.handle_msg(&mut from, now, msg, None);
        if let (Some(s), Msg::Sync { state, .. }) = (snap, msg)
            && self
                .dpu
                .conn(state.conn)
                .is_some_and(|c| c.role == Role::Owner && c.state == state)
        {
            self.sw.adopt(now, &s);
        }
    }

    /// A frame from the plane in `slot` ([`DpuSwitch::process_from_plane`] for the active
    /// plane's; a fenced plane's packets are served, as the model serves them).
    pub fn process_from_slot<'a>(
        &'a mut self,
        now: Instant,
        slot: PlaneSlot,
        port: PortId,
        msg: Msg,
        (gso_size, frame): (u16, &'a [u8]),
    ) -> Outcome<'a> {
        self.take_from_plane(now, (port, gso_size, frame), msg, |m, now, msg| {
            m.handle_msg_from(now, slot, msg)
        })
    }

    /// The next message for the warm standby plane (the DPU's bulk sync of it and its relays,
    /// [`DpuNode::poll_warm_transmit`]) with the conntrack snapshot of the connection it
    /// carries, as this pipeline holds it now. Poll it after every input, as
    /// [`DpuSwitch::poll_transmit`]; the warm plane is the other slot than
    /// [`DpuNode::active_slot`] at the time of the poll.
    pub fn poll_warm_transmit(&mut self, now: Instant) -> Option<Outgoing> {
        let t = DpuModel::poll_warm_transmit(&mut self.dpu)?;
        let snapshot = t.msg.state_conn().and_then(|c| self.sw.snapshot(now, c));
        Some(Outgoing::Msg {
            channel: t.channel,
            msg: t.msg,
            snapshot,
        })
    }

    /// Whether a conntrack change from the plane in `slot` may be taken: only the active
    /// plane owns connections, so only its changes are an owner's.
    pub fn takes_conntrack_from(&self, slot: PlaneSlot) -> bool {
        self.dpu.sender(slot) == Sender::Active
    }
}

/// The DPU model taking a plane's message as from `slot`, for the joining rules.
struct FromSlot<'a, M: DpuModel> {
    dpu: &'a mut M,
    slot: PlaneSlot,
}

impl<M: DpuModel> Model for FromSlot<'_, M> {
    fn role(&self, conn: ConnId) -> Option<Role> {
        self.dpu.conn(conn).map(|c| c.role)
    }
    fn handle_msg(&mut self, now: Instant, msg: Msg) {
        self.dpu.handle_msg_from(now, self.slot, msg);
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.dpu.poll_transmit()
    }
}
