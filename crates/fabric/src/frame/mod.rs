//! Frame-level nodes: the fabric model and the vSwitch joined, one call per frame.
//!
//! The model nodes ([`DpuNode`](crate::dpu::DpuNode),
//! [`SpillPlane`](crate::spill::SpillPlane)) reason about connections and packet trains; the
//! vSwitch [`Pipeline`] about bytes. A driver that moves real frames needs both, and every
//! rule that joins them (which frame is which train, which conntrack snapshot a message
//! carries, whose snapshot is adopted, when a TCP state change is mirrored, when a stale entry
//! is forgotten) lives here, once, tested without I/O:
//!
//! - [`DpuSwitch`]: the DPU side. The `DpuNode` (hardware table, SoC, redirect rules,
//!   lifecycle), the DPU's `Pipeline`, and the table of connections its frames belong to
//!   ([`ConnTable`]).
//! - [`PlaneSwitch`]: the host side. The `SpillPlane`, the plane's own `Pipeline` and its
//!   `ConnTable`.
//!
//! # One call, one result
//!
//! A driver hands a node a frame (`process_*`) and gets back one [`Outcome`]: out of a port
//! with these bytes, steered to the plane, straight into a VM's memory, back to the DPU,
//! punted, or dropped with a [`FrameDrop`] reason the node has counted. The bytes of a
//! forwarded frame are the node's own frame buffer, lent to the caller until its next call: the
//! caller copies them into its TAP, ring or VM queue, with no copy in between. A driver that
//! reads frames into buffers of its own lends one for the call instead
//! ([`DpuSwitch::process_in_place`]): the pipeline rewrites the frame where it was read, and the
//! driver sends it from there, so the frame is never copied in user space. Nothing is left
//! for the driver to finish: no "what did you do with it" question after the call, no pairing
//! of messages with frames by id.
//!
//! # Polling order
//!
//! For each input at `now`: one `process_*` or `handle_*` call, whose [`Outcome`] the driver
//! acts on before its next call to the node; then [`DpuSwitch::poll_transmit`] (or the plane's)
//! until `None`: every message of the fabric protocol, with the conntrack snapshot of the
//! connection it carries already attached, in the order the model sent them, and after the
//! messages a frame caused, the conntrack change it made ([`Outgoing::Conntrack`]). A snapshot
//! is taken when the node queues the message, after the frame that caused it went through the
//! pipeline, so a state sync carries the entry as that frame left it.

/// The part of a frame node's API both nodes share, written once: `$model` is the node's
/// model field, `$other` names the other side in the docs.
macro_rules! switch_api {
    ($model:ident, $other:literal) => {
        /// The node's vSwitch pipeline.
        pub fn pipeline(&self) -> &spillway_vswitch::pipeline::Pipeline {
            &self.sw.pipeline
        }

        /// Replaces the vSwitch policy (a new epoch).
        pub fn set_policy(&mut self, policy: spillway_vswitch::policy::Policy) {
            self.sw.pipeline.set_policy(policy);
        }

        /// The classifier's connections.
        pub fn conns(&self) -> &super::ConnTable {
            &self.sw.conns
        }

        /// Counters.
        pub fn counters(&self) -> &super::FrameCounters {
            &self.sw.counters
        }

        #[doc = concat!("A flow-vNIC or control message from the ", $other, ", with the conntrack snapshot it carried.")]
        pub fn handle_msg(
            &mut self,
            now: spillway_vswitch::Instant,
            msg: crate::types::Msg,
            snap: Option<spillway_vswitch::conntrack::CtSnapshot>,
        ) {
            self.sw.handle_msg(&mut self.$model, now, msg, snap);
        }

        #[doc = concat!("A conntrack change of a connection the ", $other, " owns.")]
        pub fn handle_conntrack(
            &mut self,
            now: spillway_vswitch::Instant,
            snap: &spillway_vswitch::conntrack::CtSnapshot,
        ) {
            self.sw.handle_conntrack(&self.$model, now, snap);
        }

        #[doc = concat!("The next message for the ", $other, ", its snapshot attached.")]
        pub fn poll_transmit(&mut self, now: spillway_vswitch::Instant) -> Option<super::Outgoing> {
            self.sw.poll_transmit(&mut self.$model, now)
        }

        /// The vNIC lane output `o` goes on with `shards` shards of `redirect_buckets`
        /// buckets ([`crate::types::Msg::lane`]; a conntrack change by its connection's key).
        pub fn lane_of(&self, o: &super::Outgoing, redirect_buckets: u16, shards: usize) -> usize {
            match o {
                super::Outgoing::Msg { msg, .. } => msg.lane(redirect_buckets, shards),
                super::Outgoing::Conntrack(s) => crate::dpu::shard_of(
                    self.sw.conns.id_of(s.zone, &s.orig),
                    redirect_buckets,
                    shards,
                ),
            }
        }

        /// When the model next needs its `handle_timeout` (through the model accessor).
        pub fn poll_timeout(&self) -> Option<spillway_vswitch::Instant> {
            self.$model.poll_timeout()
        }

        /// Forgets idle connections (classifier records, conntrack entries, flow entries), a
        /// bounded amount per call; call it every few hundred milliseconds.
        pub fn expire(&mut self, now: spillway_vswitch::Instant) {
            self.sw.expire(now);
        }
    };
}

mod conns;
mod dpu;
mod pair;
mod plane;

use std::collections::VecDeque;

use spillway_vswitch::conntrack::CtSnapshot;
use spillway_vswitch::packet::HEADROOM;
use spillway_vswitch::pipeline::Pipeline;
use spillway_vswitch::{DropReason, Instant, PacketBuf, PortId, TenantId, Verdict};
use spillway_wire::{FlowKey, ParsedFrame, ip_proto, parse_frame_decap};

pub use conns::{ConnRecord, ConnTable, ConnTableCounters, conn_id};
pub use dpu::{DpuModel, DpuSwitch, ShardModel};
pub use pair::{Pair, Through};
pub use plane::{PlaneModel, PlaneShardModel, PlaneSwitch};

use crate::records::Role;
use crate::types::{Channel, ConnId, Msg, SyncKind, Transmit};

/// The largest frame a node takes: a 64 KiB GSO frame with its Ethernet and VLAN headers.
pub const FRAME_MAX: usize = 18 + 65_535;

/// Connections a node's [`ConnTable`] remembers by default (the model has its own limits).
pub const CONNS_MAX: usize = 1 << 20;

/// The pipeline configuration and classifier size of one of `shards` frame nodes that
/// together stand for one node (a driver's thread per shard): the default tables (flow
/// entries, conntrack, [`CONNS_MAX`] classifier records) split evenly, so that `shards`
/// threads reserve and hold what one node would. Connections spread over shards by their
/// hash, as over RSS queues.
pub fn shard_capacities(shards: usize) -> (spillway_vswitch::pipeline::PipelineConfig, usize) {
    let n = shards.max(1);
    let mut config = spillway_vswitch::pipeline::PipelineConfig::default();
    config.flow_table.capacity = config.flow_table.capacity.div_ceil(n);
    config.conntrack.capacity = config.conntrack.capacity.div_ceil(n);
    (config, CONNS_MAX.div_ceil(n))
}

/// How long a connection may idle before [`DpuSwitch::expire`] forgets its classifier record.
pub const CONN_IDLE: core::time::Duration = core::time::Duration::from_secs(120);

/// Classifier records looked at per [`DpuSwitch::expire`] call.
pub const EXPIRE_BUDGET: usize = 4096;

/// What became of a frame handed to a node.
#[derive(Debug, PartialEq)]
pub enum Outcome<'a> {
    /// Send `bytes` out of `port`. `generated` when the vSwitch made these bytes itself (an
    /// ICMP error, an ARP or ND answer): their checksums are complete and nothing in them is
    /// offloaded; otherwise they keep the offload metadata (virtio-net header) the frame came
    /// with.
    Forward {
        /// The port the frame leaves by.
        port: PortId,
        /// The frame.
        bytes: &'a [u8],
        /// The vSwitch made the frame (no offload applies).
        generated: bool,
    },
    /// DPU: send the frame as it came, with its ingress port and offload metadata, to the
    /// spill plane on the phy vNIC, with `msg` (the packets the model steered).
    Steer {
        /// The `Packets` message the frame rides.
        msg: Msg,
    },
    /// Plane: copy `bytes` straight into the memory of the VM on `port` (the vATC path). A
    /// driver that cannot (no translation yet, no receive buffer, no shared memory) calls
    /// [`PlaneSwitch::direct_refused`], which sends it back through the DPU instead.
    Direct {
        /// The VM's port.
        port: PortId,
        /// The frame.
        bytes: &'a [u8],
        /// The vSwitch made the frame.
        generated: bool,
    },
    /// Plane: send `bytes`, processed, back to the DPU on the phy vNIC with `msg`, to leave by
    /// `port`.
    Return {
        /// The `Packets` message the frame rides.
        msg: Msg,
        /// The port the frame leaves the DPU by.
        port: PortId,
        /// The frame.
        bytes: &'a [u8],
        /// The vSwitch made the frame.
        generated: bool,
    },
    /// Plane: send the frame as it came back to the DPU, whose slow path takes it (the plane
    /// has no state for its connection yet), with `msg`.
    Punt {
        /// The `Punt` message the frame rides.
        msg: Msg,
    },
    /// DPU, with the connections sharded over threads: the frame's connection is shard
    /// `shard`'s, served on another thread; the driver hands the frame, as it came, to that
    /// thread's node. Found from the node's own parse, before it learnt or changed anything.
    Elsewhere {
        /// The shard whose thread serves the frame.
        shard: usize,
    },
    /// Dropped; the node has counted it under the reason.
    Drop(FrameDrop),
}

/// Why a node dropped a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameDrop {
    /// The frame did not parse (`drop.parse`).
    Parse,
    /// No IP 5-tuple and not ARP or neighbour discovery (`drop.non_ip`).
    NonIp,
    /// No tenant: it came in by a port the policy does not have, or by the uplink without a
    /// VNI the policy knows (`drop.no_tenant`).
    NoTenant,
    /// The vSwitch pipeline dropped it (`drop.vswitch`; the pipeline counts the reason).
    Vswitch(DropReason),
    /// A limit of the fabric model dropped it, or the model has no state for it
    /// (`drop.fabric`; the model counts the reason).
    Fabric,
    /// The model admitted only some of a GSO frame's segments; the frame is dropped whole
    /// (`drop.partial_gso`).
    PartialGso,
    /// A phy-vNIC record whose message carries no packets (`drop.protocol`).
    Protocol,
}

/// What a node sends the other side, besides frames.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Outgoing {
    /// A message of the fabric protocol on `channel` (the flow vNIC or the reliable control
    /// channel), with the conntrack entry of the connection it carries as this side's pipeline
    /// holds it, if it has one.
    Msg {
        /// [`Channel::FlowVnic`] or [`Channel::Control`].
        channel: Channel,
        /// The message.
        msg: Msg,
        /// The connection's conntrack entry.
        snapshot: Option<CtSnapshot>,
    },
    /// The conntrack entry of a connection this side owns stepped (a TCP state change): the
    /// other side's copy follows it. On the flow vNIC.
    Conntrack(CtSnapshot),
}

spillway_vswitch::counters! {
    // The generated method is `iter_own`: the node's `iter` below also yields the connection
    // table's counters, and its callers in the drivers take both in one pass.
    iter = iter_own;
    /// A node's counters, named without the process prefix (`rt.` for the DPU process, `plane.`
    /// for the plane's).
    #[derive(Copy, PartialEq, Eq)]
    pub struct FrameCounters {
        /// Frames that did not parse.
        drop_parse => "drop.parse",
        /// Frames with no IP 5-tuple, other than ARP and neighbour discovery.
        drop_non_ip => "drop.non_ip",
        /// Frames from a port the policy does not have, or from the uplink with a VNI it does
        /// not know.
        drop_no_tenant => "drop.no_tenant",
        /// Frames the vSwitch pipeline dropped (policy, spoofing, no route...).
        drop_vswitch => "drop.vswitch",
        /// Frames the fabric model dropped (a limit, or no state).
        drop_fabric => "drop.fabric",
        /// GSO frames the model admitted only in part (dropped whole).
        drop_partial_gso => "drop.partial_gso",
        /// Phy-vNIC records whose message carries no packets.
        drop_protocol => "drop.protocol",
        /// ARP and neighbour-discovery frames handed to the pipeline's responder (its
        /// `vswitch.neigh.*` counters say what became of them).
        neigh_frames => "neigh.frames",
        /// Conntrack snapshots from the other side adopted.
        adopted => "snapshot.adopted",
        /// Snapshots the pipeline refused (SNAT, a full table).
        adopt_refused => "snapshot.refused",
        /// Phy-vNIC messages of the model with no frame to carry (the model emits them only
        /// while it handles a frame; any other is a bug, counted, not sent).
        orphan => "transmit.orphan",
    }
}

impl FrameCounters {
    /// Names (without the process prefix) and values, with the connection table's: this
    /// node's own counters in declaration order, then the table's (`flows.*`).
    pub fn iter<'a>(
        &'a self,
        conns: &'a ConnTableCounters,
    ) -> impl Iterator<Item = (&'static str, u64)> + 'a {
        self.iter_own().chain(conns.iter())
    }

    fn count(&mut self, d: FrameDrop) {
        *match d {
            FrameDrop::Parse => &mut self.drop_parse,
            FrameDrop::NonIp => &mut self.drop_non_ip,
            FrameDrop::NoTenant => &mut self.drop_no_tenant,
            FrameDrop::Vswitch(_) => &mut self.drop_vswitch,
            FrameDrop::Fabric => &mut self.drop_fabric,
            FrameDrop::PartialGso => &mut self.drop_partial_gso,
            FrameDrop::Protocol => &mut self.drop_protocol,
        } += 1;
    }
}

/// Whether `msg` comes from the connection's owner (or hands ownership over), so that the
/// conntrack snapshot riding on it is authoritative. An `Update` comes from a side holding only
/// a copy: its snapshot may be behind the owner's and must not replace it.
pub fn carries_owner_state(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::Sync {
            kind: SyncKind::Mirror | SyncKind::Handover,
            ..
        } | Msg::Recall { .. }
            | Msg::DeleteAck { state: Some(_), .. }
    )
}

/// The model under a frame node, as the joining rules see it: any [`DpuModel`], or a
/// [`PlaneModel`].
pub trait Model {
    /// This side's role for `conn`, if it holds the connection.
    fn role(&self, conn: ConnId) -> Option<Role>;
    /// A fabric message from the other side.
    fn handle_msg(&mut self, now: Instant, msg: Msg);
    /// The model's next message.
    fn poll_transmit(&mut self) -> Option<Transmit>;
}

/// The vSwitch half of a frame node, and every rule joining it to the model: its pipeline, its
/// connection table, its one frame buffer and its queue of outgoing messages.
#[derive(Debug)]
pub(crate) struct SwitchCore {
    pub(crate) pipeline: Pipeline,
    pub(crate) conns: ConnTable,
    pub(crate) pkt: PacketBuf,
    out: VecDeque<Outgoing>,
    /// Messages at the back of `out` still waiting for their snapshots.
    unsealed: usize,
    pub(crate) counters: FrameCounters,
}

/// A conntrack change to mirror: the connection's zone and tuple, and its state before.
pub(crate) struct Watch {
    zone: TenantId,
    key: FlowKey,
    before: Option<spillway_vswitch::conntrack::CtState>,
}

impl SwitchCore {
    pub(crate) fn new(pipeline: Pipeline, conns_max: usize) -> SwitchCore {
        SwitchCore {
            pipeline,
            conns: ConnTable::new(conns_max),
            pkt: PacketBuf::with_capacity(HEADROOM + FRAME_MAX),
            out: VecDeque::with_capacity(256),
            unsealed: 0,
            counters: FrameCounters::default(),
        }
    }

    /// Counts `d` and returns it as the outcome.
    pub(crate) fn drop<'a>(&mut self, d: FrameDrop) -> Outcome<'a> {
        Outcome::Drop(self.count(d))
    }

    /// Counts `d` and returns it.
    pub(crate) fn count(&mut self, d: FrameDrop) -> FrameDrop {
        self.counters.count(d);
        d
    }

    /// The mirror rule: a side that owns a TCP connection tells the other side's copy when
    /// the frame steps its conntrack state. `linked` is whether there is another side.
    pub(crate) fn watch(
        &self,
        now: Instant,
        role: Option<Role>,
        linked: bool,
        zone: TenantId,
        key: Option<FlowKey>,
    ) -> Option<Watch> {
        let key = key.filter(|k| k.proto == ip_proto::TCP)?;
        if !linked || role != Some(Role::Owner) {
            return None;
        }
        let before = self.pipeline.export_conn(now, zone, &key).map(|s| s.state);
        Some(Watch { zone, key, before })
    }

    /// Copies `frame` into the node's buffer, then parses it there ([`SwitchCore::parse_loaded`]).
    /// Every frame is parsed in memory the node owns (its own buffer, or a driver's lent for an
    /// in-place call), never where the caller holds it: a frame in memory another process can
    /// write (a vNIC ring) could change between the parse and the pipeline, and the bytes the
    /// pipeline rewrites and forwards must be the bytes it classified.
    pub(crate) fn load_and_parse(
        &mut self,
        ingress: PortId,
        frame: &[u8],
    ) -> Result<ParsedFrame, FrameDrop> {
        if self.pkt.load(frame).is_err() {
            return Err(self.count(FrameDrop::Parse));
        }
        self.parse_loaded(ingress)
    }

    /// The frame in the node's buffer parsed as the pipeline parses it (VXLAN only on the
    /// uplink, for our VTEP): the node classifies on this parse and hands it to
    /// [`SwitchCore::run`], so a frame is parsed once. A frame that does not parse is counted
    /// and dropped.
    pub(crate) fn parse_loaded(&mut self, ingress: PortId) -> Result<ParsedFrame, FrameDrop> {
        let decap = self.pipeline.policy().host().decap_at(ingress);
        parse_frame_decap(self.pkt.data(), decap).map_err(|_| {
            self.counters.count(FrameDrop::Parse);
            FrameDrop::Parse
        })
    }

    /// The tenant of a frame from `port`, `parsed`: its VNI's when it came VXLAN-encapsulated
    /// on the uplink, else the port's.
    pub(crate) fn tenant_of(&self, port: PortId, parsed: &ParsedFrame) -> Option<TenantId> {
        let policy = self.pipeline.policy();
        match parsed.vxlan {
            Some(v) if port == policy.host().uplink_port => policy.tenant_by_vni(v.vni),
            _ => policy.port(port).map(|p| p.tenant),
        }
    }

    /// Runs the pipeline, where it is, on the frame in the node's buffer from `ingress`,
    /// `parsed` by [`SwitchCore::parse_loaded`]: the egress port, or why it was dropped
    /// (counted), and the conntrack change to mirror if `watch` saw one.
    pub(crate) fn run(
        &mut self,
        now: Instant,
        ingress: PortId,
        (gso_size, parsed): (u16, &ParsedFrame),
        watch: Option<Watch>,
    ) -> (Result<PortId, FrameDrop>, Option<CtSnapshot>) {
        self.pkt.set_gso_size(gso_size);
        let verdict = self
            .pipeline
            .process_parsed(now, ingress, &mut self.pkt, parsed);
        let changed = watch.and_then(|w| {
            let after = self.pipeline.export_conn(now, w.zone, &w.key)?;
            (Some(after.state) != w.before).then_some(after)
        });
        let r = match verdict {
            Verdict::Forward(out) => Ok(out),
            Verdict::Drop(reason) => {
                self.counters.count(FrameDrop::Vswitch(reason));
                Err(FrameDrop::Vswitch(reason))
            }
        };
        (r, changed)
    }

    /// The frame in the buffer, forwarded out of `port`.
    pub(crate) fn forwarded(&self, port: PortId) -> Outcome<'_> {
        Outcome::Forward {
            port,
            bytes: self.pkt.data(),
            generated: self.pkt.is_generated(),
        }
    }

    /// Queues the model's messages; [`SwitchCore::seal`] attaches their snapshots once the
    /// frame that caused them has gone through the pipeline. The phy-vNIC message for
    /// connection `frame` (the frame being handled) is returned instead: it is that frame's
    /// outcome. Any other phy message has no frame and is counted.
    pub(crate) fn drain(&mut self, model: &mut impl Model, frame: Option<ConnId>) -> Option<Msg> {
        let mut phy = None;
        while let Some(t) = model.poll_transmit() {
            match (t.channel, t.msg.train()) {
                (Channel::PhyVnic, Some(tr)) if Some(tr.conn) == frame && phy.is_none() => {
                    phy = Some(t.msg);
                }
                (Channel::PhyVnic, _) => self.counters.orphan += 1,
                (channel, _) => {
                    self.out.push_back(Outgoing::Msg {
                        channel,
                        msg: t.msg,
                        snapshot: None,
                    });
                    self.unsealed += 1;
                }
            }
        }
        phy
    }

    /// Attaches to each message queued since the last call the snapshot of the connection it
    /// carries, as this pipeline holds it now, then queues the conntrack change `changed` (a
    /// copy the other side makes from a mirror then exists when the change arrives).
    pub(crate) fn seal(&mut self, now: Instant, changed: Option<CtSnapshot>) {
        let from = self.out.len() - self.unsealed;
        for i in from..self.out.len() {
            if let Outgoing::Msg { msg, snapshot, .. } = self.out[i]
                && snapshot.is_none()
                && let Some(conn) = msg.state_conn()
            {
                let s = self.snapshot(now, conn);
                if let Outgoing::Msg { snapshot, .. } = &mut self.out[i] {
                    *snapshot = s;
                }
            }
        }
        self.unsealed = 0;
        if let Some(s) = changed {
            self.out.push_back(Outgoing::Conntrack(s));
        }
    }

    /// The next outgoing item: those queued while frames were handled first, then the model's
    /// newer messages (queued here the moment a frame drains the model, so the order holds).
    pub(crate) fn poll_transmit(
        &mut self,
        model: &mut impl Model,
        now: Instant,
    ) -> Option<Outgoing> {
        if self.out.is_empty() {
            self.drain(model, None);
        }
        self.seal(now, None);
        self.out.pop_front()
    }

    /// The snapshot of `conn`'s conntrack entry in this pipeline, if it has one.
    pub(crate) fn snapshot(&self, now: Instant, conn: ConnId) -> Option<CtSnapshot> {
        let rec = self.conns.get(conn)?;
        self.pipeline.export_conn(now, rec.zone, &rec.orig)
    }

    /// The role the model gives the connection `s` belongs to.
    fn role_of(&self, model: &impl Model, s: &CtSnapshot) -> Option<Role> {
        model.role(self.conns.id_of(s.zone, &s.orig))
    }

    /// A fabric message (with the snapshot it carried) for `model`. A `Closed` sync means the
    /// other side carried the connection's last packet: this pipeline's entry is a stale copy
    /// that would refuse the tuple's next SYN. The snapshot is adopted only from the owner (or
    /// a hand-over), and only if the model still holds the connection after the message: a
    /// late mirror of a connection closed meanwhile must not bring it back.
    pub(crate) fn handle_msg(
        &mut self,
        model: &mut impl Model,
        now: Instant,
        msg: Msg,
        snap: Option<CtSnapshot>,
    ) {
        if let Msg::Sync {
            kind: SyncKind::Closed,
            state,
            ..
        } = msg
            && let Some(rec) = self.conns.forget(state.conn)
        {
            self.pipeline.forget_conn(now, rec.zone, &rec.orig);
        }
        model.handle_msg(now, msg);
        if let Some(s) = snap
            && carries_owner_state(&msg)
            && self.role_of(model, &s).is_some()
        {
            self.adopt(now, &s);
        }
    }

    /// A conntrack change of a connection the other side owns: this side keeps its copy
    /// current, and only a copy (an owner's state is its own).
    pub(crate) fn handle_conntrack(&mut self, model: &impl Model, now: Instant, s: &CtSnapshot) {
        if self.role_of(model, s) == Some(Role::Copy) {
            self.adopt(now, s);
        }
    }

    pub(crate) fn adopt(&mut self, now: Instant, s: &CtSnapshot) {
        self.conns.learn(now, s.zone, s.orig);
        match self.pipeline.adopt_conn(now, s) {
            Ok(()) => self.counters.adopted += 1,
            Err(_) => self.counters.adopt_refused += 1,
        }
    }

    /// Forgets idle classifier records and expired pipeline state, a bounded amount per call.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.conns.expire(now, CONN_IDLE, EXPIRE_BUDGET);
        self.pipeline.expire(now, EXPIRE_BUDGET);
    }
}

/// Segments a GSO frame of `frame_len` bytes stands for, its payload starting at
/// `payload_offset`; 1 for a frame without GSO (`gso_size` 0).
pub(crate) fn gso_segments(gso_size: u16, frame_len: usize, payload_offset: usize) -> u32 {
    if gso_size == 0 {
        return 1;
    }
    let payload = frame_len.saturating_sub(payload_offset);
    payload.div_ceil(usize::from(gso_size)).max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_the_tables_of_one_node_and_one_shard_keeps_them_whole() {
        let whole = spillway_vswitch::pipeline::PipelineConfig::default();
        let (one, conns_one) = shard_capacities(1);
        assert_eq!(one.flow_table.capacity, whole.flow_table.capacity);
        assert_eq!(one.conntrack.capacity, whole.conntrack.capacity);
        assert_eq!(conns_one, CONNS_MAX);
        for n in [2, 3, 7] {
            let (c, conns) = shard_capacities(n);
            // Together at least the whole (rounded up), and no shard more than its share.
            assert!(c.flow_table.capacity * n >= whole.flow_table.capacity);
            assert!(c.flow_table.capacity * n < whole.flow_table.capacity + n);
            assert!(c.conntrack.capacity * n >= whole.conntrack.capacity);
            assert!(c.conntrack.capacity * n < whole.conntrack.capacity + n);
            assert!(conns * n >= CONNS_MAX && conns * n < CONNS_MAX + n);
            // A shard's pipeline builds with its share.
            let policy = spillway_vswitch::policy::Policy::from_toml_str(
                include_str!("../../../../examples/policy-basic.toml"),
                "examples/policy-basic.toml",
            )
            .expect("the example loads");
            assert!(Pipeline::new(policy, c).is_ok(), "{n} shards");
        }
    }
}
