//! The vocabulary the fabric's nodes exchange: connections, packet trains, connection state and
//! the messages on the vNIC set and the control channel.

use core::fmt;
use spillway_vswitch::{Instant, TenantId};

pub use crate::records::Role;

/// A connection (both directions of one 5-tuple pair). The workload assigns ids; the DPU's
/// redirect hash and every table key derive from it, as a real DPU derives them from the
/// 5-tuple.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct ConnId(pub u64);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn:{}", self.0)
    }
}

impl ConnId {
    /// The 5-tuple hash (SplitMix64 finaliser of the id): what RSS and the redirect rules see.
    pub fn hash(self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The redirect bucket of the connection among `buckets`.
    pub fn bucket(self, buckets: u16) -> u16 {
        (self.hash() % u64::from(buckets)) as u16
    }
}

/// Which side of a connection sent a packet: the initiator (`Orig`) or the responder.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Side {
    /// Initiator to responder.
    Orig,
    /// Responder to initiator.
    Reply,
}

/// Where a packet goes after the vSwitch: into a VM on this host, or out of the uplink. Decides
/// the PCIe crossings a spilled packet makes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Dest {
    /// A VM on this host (a PCIe crossing from the DPU).
    Vm,
    /// The uplink.
    Wire,
}

/// What a packet does to its connection.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Kind {
    /// Opens the connection (TCP SYN, first UDP datagram): a new connection on the slow path.
    Open,
    /// A TCP control packet of a known connection (SYN-ACK, FIN, pure ACK of the handshake or
    /// the teardown): steps the state machine.
    Control,
    /// Payload of a known connection.
    Data,
    /// The last packet of the connection (the final ACK of the teardown, or a UDP flow's last):
    /// after it the connection's state and flow entries are removed.
    Close,
}

/// `packets` packets of one connection and direction that arrive together. The fluid unit of the
/// simulator; the real-time driver offers trains of one packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Train {
    /// The connection.
    pub conn: ConnId,
    /// Its tenant.
    pub tenant: TenantId,
    /// Who sent it.
    pub side: Side,
    /// Where it goes.
    pub dest: Dest,
    /// What it does to the connection.
    pub kind: Kind,
    /// Packets in the train, at least 1.
    pub packets: u32,
    /// Bytes of each packet.
    pub packet_bytes: u32,
    /// When the train was offered to the fabric (its latency is measured from here).
    pub born: Instant,
    /// The tenant's policy denies this connection (the slow path drops it, `policy.deny`).
    pub denied: bool,
}

/// Lifecycle of a connection as its owner tracks it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum ConnPhase {
    /// Opened; the other side has not answered.
    Opening,
    /// Both sides have sent.
    Established,
    /// A FIN or similar was seen.
    Closing,
}

/// The conntrack state that moves with a connection between planes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConnState {
    /// The connection.
    pub conn: ConnId,
    /// Its tenant (conntrack zone).
    pub tenant: TenantId,
    /// Where it is in its life.
    pub phase: ConnPhase,
    /// Packets the connection has carried (both sides).
    pub packets: u64,
    /// State changes so far; the sync protocol keeps the newest version.
    pub version: u32,
    /// When it was opened.
    pub opened: Instant,
}

impl ConnState {
    /// State of a connection opened at `now` by `train`.
    pub fn open(now: Instant, train: &Train) -> ConnState {
        ConnState {
            conn: train.conn,
            tenant: train.tenant,
            phase: ConnPhase::Opening,
            packets: u64::from(train.packets),
            version: 1,
            opened: now,
        }
    }

    /// Applies a train of a known connection; returns true if the phase changed (a change the
    /// mirror must carry).
    pub fn apply(&mut self, train: &Train) -> bool {
        self.packets += u64::from(train.packets);
        let next = match (self.phase, train.kind, train.side) {
            (ConnPhase::Opening, _, Side::Reply) => ConnPhase::Established,
            (ConnPhase::Established, Kind::Control, _) => ConnPhase::Closing,
            (p, _, _) => p,
        };
        if next != self.phase {
            self.phase = next;
            self.version += 1;
            true
        } else {
            false
        }
    }
}

/// Which plane holds a connection's state, for the flow dump and the one-owner invariant.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Owner {
    /// The DPU, with live hardware entries.
    DpuHw,
    /// The DPU's SoC slow path (no live hardware entry).
    DpuSoc,
    /// The host spill plane.
    Spill,
}

/// Sync colour: one per activation. A plane goes active only when the bulk sync of its colour
/// has completed (SONiC-DASH "perfect sync").
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct Colour(pub u32);

/// One of the DPU's two plane slots: a vNIC set (phy and flow vNICs, a control channel) with
/// the plane process behind it. One slot is active (its plane is the one the redirect rules
/// steer to); with warm standby the other holds a warm plane kept in sync in shadow, which a
/// failover makes active by flipping the redirect rules to its set in one step.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct PlaneSlot(pub u8);

impl PlaneSlot {
    /// The other slot.
    pub fn other(self) -> PlaneSlot {
        PlaneSlot(1 - (self.0 & 1))
    }
    /// 0 or 1, for indexing a driver's two processes.
    pub fn index(self) -> usize {
        usize::from(self.0 & 1)
    }
}

impl fmt::Display for PlaneSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot {}", self.0)
    }
}

/// Why the DPU hands a connection to the spill plane, or the plane back to the DPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SyncKind {
    /// Shadow-mode copy: the receiver keeps it, the sender stays owner.
    Mirror,
    /// Ownership moves to the receiver with this state.
    Handover,
    /// A state change seen by a plane holding only a copy, for the owner: applied if the
    /// receiver still has the connection, never creating a record (a late update must not
    /// resurrect a connection that has closed meanwhile).
    Update,
    /// The connection closed (seen by whichever plane carried its last packet): the receiver
    /// forgets it, owner or copy.
    Closed,
}

/// Messages between the DPU node and the spill plane.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Msg {
    /// Packets on the phy vNIC (redirected to the host, or processed and sent back).
    Packets(Train),
    /// Phy vNIC, host -> DPU: packets the plane could not process because it has no state for
    /// their connection (redirected before the owner's mirror reached it); the DPU's slow path
    /// takes them as the owner would.
    Punt(Train),
    /// Flow vNIC: a connection's state (bulk shadow sync, mirror of a change, or a handover).
    Sync {
        /// The colour of the sync round.
        colour: Colour,
        /// Mirror or handover.
        kind: SyncKind,
        /// The state.
        state: ConnState,
    },
    /// Flow vNIC: end of a bulk sync, `count` states sent by DPU shard `shard` (and the
    /// plane's acknowledgement of it, from its shard of the same index).
    SyncDone {
        /// Colour of the round.
        colour: Colour,
        /// States sent.
        count: u64,
        /// The shard whose vNIC set carried the states.
        shard: u16,
    },
    /// Flow vNIC, host -> DPU: install the connection's two entries into the hardware fast path
    /// and take ownership with this state (a recall).
    Recall {
        /// The connection's state.
        state: ConnState,
        /// Its measured rate, packets/s (charged against the fast-path headroom).
        pps: f64,
        /// Rate of the entry this recall replaces (a rebalance swap), packets/s; 0 if none.
        replaces_pps: f64,
    },
    /// Flow vNIC, DPU -> host: the recall's entries are live (ownership moved) or refused.
    RecallDone {
        /// The connection.
        conn: ConnId,
        /// True when the entries are live.
        ok: bool,
    },
    /// Control channel, host -> DPU: remove the connection's hardware entries and hand it back
    /// (a demotion). Reliable: retransmitted until acknowledged.
    Delete {
        /// Sequence number for acknowledgement and duplicate suppression.
        seq: u64,
        /// The connection.
        conn: ConnId,
    },
    /// Control channel, DPU -> host: the delete took effect; the state comes back with it.
    DeleteAck {
        /// The acknowledged sequence number.
        seq: u64,
        /// The state, if the DPU still had the connection.
        state: Option<ConnState>,
    },
    /// Control, host -> DPU: the plane holds `conn` as owner now (after a handover or a
    /// delete's ack); the DPU may remove its hardware entries, since redirected packets will
    /// find the state.
    Adopted {
        /// The connection.
        conn: ConnId,
    },
    /// Control, DPU -> host: the redirect rules are live; the plane is active.
    Activated {
        /// Colour of the activation.
        colour: Colour,
    },
    /// Control, DPU -> host: release: hand every owned connection back.
    Release {
        /// Colour of the activation being released.
        colour: Colour,
    },
    /// Control, host -> DPU: every owned connection was handed back (`count` of them).
    Released {
        /// Colour.
        colour: Colour,
        /// Connections handed back.
        count: u64,
        /// The plane's shard that sent them (every shard sends one).
        shard: u16,
    },
    /// Control, DPU -> host: the redirect rules are gone; finish what is in flight. One per
    /// shard: the plane's shard `shard` answers once it has received the `packets` that DPU
    /// shard steered to this plane (a drain fence: this message, on the control channel, may
    /// overtake them on the phy vNIC).
    Drain {
        /// Colour.
        colour: Colour,
        /// The shard.
        shard: u16,
        /// Packets the DPU shard steered to this plane since it became the active one.
        packets: u64,
    },
    /// Control, host -> DPU: nothing is in flight any more.
    Drained {
        /// Colour.
        colour: Colour,
        /// The plane's shard that is idle (every shard sends one).
        shard: u16,
    },
    /// Control, host -> DPU: the first redirected packet was served (overflow absorbed).
    Absorbing,
    /// Control, DPU -> host: a recalled connection's rate over the last stats period (the
    /// hardware flow-stats dump OVS's rebalance reads).
    OffloadStats {
        /// The connection.
        conn: ConnId,
        /// Packets/s over the period.
        pps: f64,
    },
    /// Control, DPU -> host: the recall budget for the next placement decisions.
    Budget {
        /// Free hardware entries.
        free_entries: u64,
        /// Fast-path headroom, packets/s.
        headroom_pps: f64,
    },
    /// Control, host -> DPU: the plane is alive; `workers` workers, utilisation of the last
    /// window.
    Heartbeat {
        /// Workers running.
        workers: u32,
        /// Utilisation of the workers over the last heartbeat period.
        util: f64,
    },
    /// Control, DPU -> host: run `workers` workers.
    SetWorkers {
        /// Target worker count.
        workers: u32,
    },
    /// Flow vNIC, DPU -> plane: answer with the digest of every redirect bucket of shard
    /// `shard` that holds a record ([`Msg::Digest`]), then [`Msg::DigestDone`]. Behind every
    /// state message the DPU sent before it, so both sides digest the same changes.
    DigestAsk {
        /// The plane's colour.
        colour: Colour,
        /// The shard asked.
        shard: u16,
        /// Which comparison (the DPU's count of them, never 0): an answer to an earlier one of
        /// the same colour, still on its way, is not this one's.
        round: u16,
    },
    /// Flow vNIC, plane -> DPU: the digest of the records the plane holds in one bucket
    /// ([`bucket_digests`]).
    Digest {
        /// The colour asked with.
        colour: Colour,
        /// The round asked with (0: a releasing plane's digest of what it handed back).
        round: u16,
        /// The redirect bucket.
        bucket: u16,
        /// Records in it.
        count: u32,
        /// Their digest.
        digest: u64,
    },
    /// Flow vNIC, plane -> DPU: shard `shard` has sent its digests.
    DigestDone {
        /// The colour asked with.
        colour: Colour,
        /// The round asked with.
        round: u16,
        /// The shard.
        shard: u16,
    },
    /// Flow vNIC, DPU -> plane: bucket `bucket`'s digests differed: forget every copy in it;
    /// the DPU's mirrors of the bucket follow.
    Resync {
        /// The plane's colour.
        colour: Colour,
        /// The redirect bucket.
        bucket: u16,
    },
    /// Flow vNIC, DPU -> plane: after a flip, bucket `bucket`'s digests differed: mirror every
    /// connection the plane owns in it to the DPU again (the DPU takes each by version).
    Remirror {
        /// The plane's colour.
        colour: Colour,
        /// The redirect bucket.
        bucket: u16,
    },
    /// Flow vNIC, DPU -> plane: after a sync-back, the DPU's state of the connections the plane
    /// handed back in bucket `bucket` differed from the plane's digest of them: hand them back
    /// again (the DPU takes each by version), then [`Msg::SentBack`].
    SendBack {
        /// The colour of the activation released.
        colour: Colour,
        /// The redirect bucket.
        bucket: u16,
    },
    /// Flow vNIC, plane -> DPU: bucket `bucket`'s connections were handed back again, behind
    /// their states.
    SentBack {
        /// The colour of the activation released.
        colour: Colour,
        /// The redirect bucket.
        bucket: u16,
        /// States sent.
        count: u32,
    },
}

/// What a connection's digest covers: everything of its state the sync protocol carries and
/// versions (its packet count changes without a sync, so it is left out). SplitMix64 over the
/// fields, so that equal states hash equal on both sides.
pub fn state_digest(st: &ConnState) -> u64 {
    let phase = match st.phase {
        ConnPhase::Opening => 1u64,
        ConnPhase::Established => 2,
        ConnPhase::Closing => 3,
    };
    let mut h = st.conn.hash();
    for v in [
        u64::from(st.tenant.0),
        phase,
        u64::from(st.version),
        st.opened.0,
    ] {
        h = ConnId(h ^ v).hash();
    }
    h
}

/// Per-bucket digests of `states` over `buckets` redirect buckets: for each bucket, the
/// records in it and the wrapping sum of their [`state_digest`]s (a sum, so the order the
/// records are visited in does not matter).
pub fn bucket_digests<'a>(
    states: impl Iterator<Item = &'a ConnState>,
    buckets: u16,
) -> Vec<(u32, u64)> {
    let mut v = vec![(0u32, 0u64); usize::from(buckets)];
    for st in states {
        let b = &mut v[usize::from(st.conn.bucket(buckets))];
        b.0 += 1;
        b.1 = b.1.wrapping_add(state_digest(st));
    }
    v
}

/// The three channels between the nodes; the driver gives each its latency and (in fault
/// injection) its losses. Only [`Channel::Control`] is reliable (acks and retransmission).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum Channel {
    /// Packets.
    PhyVnic,
    /// Inserts and state sync, inline on the data path.
    FlowVnic,
    /// Deletions, lifecycle, heartbeats.
    Control,
}

/// A message a node wants sent: leaves at `at` (when the sender finished it), on `channel`.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Transmit {
    /// When the message leaves the sender.
    pub at: Instant,
    /// The channel.
    pub channel: Channel,
    /// The message.
    pub msg: Msg,
}

impl Transmit {
    /// Packets carried (for conservation accounting in the driver).
    pub fn packets(&self) -> u64 {
        self.msg.train().map_or(0, |t| u64::from(t.packets))
    }
}

impl Msg {
    /// The packets a message carries, if any.
    pub fn train(&self) -> Option<&Train> {
        match self {
            Msg::Packets(t) | Msg::Punt(t) => Some(t),
            _ => None,
        }
    }

    /// The connection a message is about: the train's, the state's, or the one named. `None`
    /// for lifecycle, heartbeat and budget messages, which concern the plane as a whole.
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            Msg::Packets(t) | Msg::Punt(t) => Some(t.conn),
            Msg::Sync { state, .. } | Msg::Recall { state, .. } => Some(state.conn),
            Msg::DeleteAck { state, .. } => state.map(|s| s.conn),
            Msg::RecallDone { conn, .. }
            | Msg::Delete { conn, .. }
            | Msg::Adopted { conn }
            | Msg::OffloadStats { conn, .. } => Some(*conn),
            Msg::SyncDone { .. }
            | Msg::Activated { .. }
            | Msg::Release { .. }
            | Msg::Released { .. }
            | Msg::Drain { .. }
            | Msg::Drained { .. }
            | Msg::Absorbing
            | Msg::Budget { .. }
            | Msg::Heartbeat { .. }
            | Msg::SetWorkers { .. }
            | Msg::DigestAsk { .. }
            | Msg::Digest { .. }
            | Msg::DigestDone { .. }
            | Msg::Resync { .. }
            | Msg::Remirror { .. }
            | Msg::SendBack { .. }
            | Msg::SentBack { .. } => None,
        }
    }

    /// The vNIC lane the message travels on when a driver runs `shards` shards of
    /// `redirect_buckets` buckets on threads of their own, one lane per shard: its
    /// connection's shard, or the shard an end marker (`SyncDone`, `Released`, `Drained`)
    /// names, so that the marker arrives behind that shard's records; lane 0 for the rest,
    /// which concern the plane as a whole.
    pub fn lane(&self, redirect_buckets: u16, shards: usize) -> usize {
        let lane = match self {
            Msg::SyncDone { shard, .. }
            | Msg::Released { shard, .. }
            | Msg::Drained { shard, .. }
            | Msg::DigestAsk { shard, .. }
            | Msg::DigestDone { shard, .. }
            | Msg::Drain { shard, .. } => usize::from(*shard),
            Msg::Digest { bucket, .. }
            | Msg::Resync { bucket, .. }
            | Msg::Remirror { bucket, .. }
            | Msg::SendBack { bucket, .. }
            | Msg::SentBack { bucket, .. } => crate::dpu::shard_of_bucket(*bucket, shards),
            m => m
                .conn()
                .map_or(0, |c| crate::dpu::shard_of(c, redirect_buckets, shards)),
        };
        if lane < shards { lane } else { 0 }
    }

    /// The connection whose state the message carries (a sync, a recall, a delete's ack with
    /// the state): the one whose conntrack entry travels with it.
    pub fn state_conn(&self) -> Option<ConnId> {
        match self {
            Msg::Sync { state, .. } | Msg::Recall { state, .. } => Some(state.conn),
            Msg::DeleteAck {
                state: Some(state), ..
            } => Some(state.conn),
            _ => None,
        }
    }
}
