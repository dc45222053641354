//! Connection tracking, one zone per tenant.
//!
//! [`Conntrack`] holds a bounded set of [`Connection`]s. A connection is named by its zone (the
//! [`TenantId`]) and either of two tuples: the *original* tuple, as its first packet was seen, and
//! the *reply* tuple expected from the other side. Without NAT the reply tuple is
//! `orig.reversed()`; with NAT it differs (the pipeline computes it). Zones isolate: the same
//! tuple in two zones names two connections.
//!
//! ICMP and ICMPv6 are tracked as Linux `nf_conntrack` does: the tuple holds the message type and
//! code besides the identifier (see `spillway_wire::FlowKey`), only a query opens a connection,
//! and its reply tuple expects the matching reply type. Errors never open or step a connection;
//! the pipeline matches them to one as *related* by the header they carry.
//!
//! # Layout
//!
//! Connections live in a slab preallocated to `capacity`. A [`CtHandle`] names a slot plus the
//! slot's generation, which is bumped every time the slot is freed, so a handle cached in a flow
//! entry stays valid exactly as long as its connection and can never name a successor. A hashbrown
//! [`HashTable`] indexes both tuples of every connection (`(zone, tuple) -> (slot, dir)`, packed in
//! a `u32`). The index is reserved at four times the connection capacity: it then never holds
//! more than half its usable size, so hashbrown cleans tombstones by rehashing in place and never
//! reallocates. Nothing allocates after [`Conntrack::new`].
//!
//! # Time
//!
//! A connection is expired once `now - last_seen >= timeout(state)` ([`Timeouts`]). Expired
//! connections are invisible to [`Conntrack::lookup`] and [`Conntrack::update`] at once, but their
//! memory and their caller-owned resources (the `tag`, e.g. a SNAT port) are only released through
//! a callback: by [`Conntrack::expire`] (bounded work per call, resuming from a cursor), or by
//! [`Conntrack::create`] when it reclaims an expired connection to make room or to free a tuple.
//! Either way the caller sees every connection that ends by time exactly once.
//!
//! # Full table
//!
//! When the table is full, `create` looks at up to `reclaim_scan` slots after the expiry cursor
//! for an expired connection to reclaim; if there is none it fails with [`CtError::Full`] (the
//! caller drops the packet with `DropReason::ConntrackFull`). Existing connections are never
//! displaced, so established traffic keeps working under a connection flood.

use core::hash::BuildHasher;
use core::time::Duration;

use foldhash::fast::FixedState;
use hashbrown::HashTable;
use spillway_wire::icmp::IcmpKind;
use spillway_wire::{FlowKey, ip_proto};

use crate::ids::TenantId;
use crate::time::Instant;

/// TCP header flag bits (RFC 9293 section 3.1) as `update` and `create` take them.
pub mod tcp_flags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// Acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
}

/// Idle timeouts per connection state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Timeouts {
    /// SYN seen, no SYN-ACK yet.
    pub tcp_syn_sent: Duration,
    /// SYN-ACK seen, handshake ACK pending.
    pub tcp_syn_recv: Duration,
    /// Handshake complete.
    pub tcp_established: Duration,
    /// First FIN seen.
    pub tcp_fin_wait: Duration,
    /// First FIN acknowledged by the other side.
    pub tcp_close_wait: Duration,
    /// FINs seen in both directions, final ACK pending.
    pub tcp_last_ack: Duration,
    /// Both FINs acknowledged.
    pub tcp_time_wait: Duration,
    /// Reset.
    pub tcp_close: Duration,
    /// UDP (and other non-TCP, non-ICMP) traffic seen in the original direction only.
    pub udp_unreplied: Duration,
    /// UDP traffic seen in both directions.
    pub udp_replied: Duration,
    /// ICMP/ICMPv6 (echo) in either state.
    pub icmp: Duration,
}

impl Default for Timeouts {
    /// Linux `nf_conntrack` defaults, except `tcp_established`.
    ///
    /// Linux keeps an idle established connection for 5 days, which on a multi-tenant vSwitch lets
    /// abandoned connections (crashed clients, migrated VMs) pin table capacity and SNAT ports for
    /// days. We use 2 hours 4 minutes instead: RFC 5382 REQ-5 makes this the shortest idle timeout
    /// a NAT may apply to an established TCP connection, since it exceeds the default 2-hour TCP
    /// keepalive interval, so keepalive-using applications survive.
    fn default() -> Self {
        Timeouts {
            tcp_syn_sent: Duration::from_secs(120),
            tcp_syn_recv: Duration::from_secs(60),
            tcp_established: Duration::from_secs(7_440),
            tcp_fin_wait: Duration::from_secs(120),
            tcp_close_wait: Duration::from_secs(60),
            tcp_last_ack: Duration::from_secs(30),
            tcp_time_wait: Duration::from_secs(120),
            tcp_close: Duration::from_secs(10),
            udp_unreplied: Duration::from_secs(30),
            udp_replied: Duration::from_secs(120),
            icmp: Duration::from_secs(30),
        }
    }
}

/// Configuration of a [`Conntrack`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ConntrackConfig {
    /// Maximum number of connections, `1..=2^31 - 1`.
    pub capacity: usize,
    /// Idle timeouts per state.
    pub timeouts: Timeouts,
    /// Slots `create` examines for an expired connection to reclaim when the table is full.
    pub reclaim_scan: usize,
    /// Seed of the index hash.
    pub hash_seed: u64,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        ConntrackConfig {
            capacity: 1 << 16,
            timeouts: Timeouts::default(),
            reclaim_scan: 8,
            hash_seed: 0xc0de_c7c7_0000_0001,
        }
    }
}

/// A configuration [`Conntrack::new`] refuses.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("conntrack capacity {actual} outside 1..={max}")]
pub struct ConntrackConfigError {
    /// The configured capacity.
    pub actual: usize,
    /// The largest supported capacity.
    pub max: usize,
}

/// Expected failures of conntrack operations. `Copy`: they are data-path values.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CtError {
    /// No room, and no expired connection was found cheaply.
    #[error("conntrack table full")]
    Full,
    /// The packet is not valid for the connection's state (or cannot open one).
    #[error("packet invalid for connection state")]
    Invalid,
    /// A live connection in the zone already owns the original or reply tuple.
    #[error("connection tuple already tracked")]
    Exists,
    /// The handle no longer names a live connection (removed, expired, or the slot reused).
    #[error("stale connection handle")]
    Stale,
}

/// Which tuple of a connection a packet matched.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum CtDir {
    /// The direction of the connection's first packet.
    Original,
    /// The other direction.
    Reply,
}

impl CtDir {
    fn index(self) -> usize {
        match self {
            CtDir::Original => 0,
            CtDir::Reply => 1,
        }
    }
}

/// TCP connection state as conntrack sees it (a coarse, Linux-like view of RFC 9293).
///
/// ```text
///                     SYN (orig)                 SYN-ACK (reply)
///   [new] ---------------------------> SynSent ------------------> SynReceived
///                                                                     | ACK (orig)
///                                                                     v
///   FinWait{c} <------------- FIN from side c ----------------- Established
///     | ACK from other side         | FIN from other side
///     v                             v
///   CloseWait{c} -- FIN from other side --> LastAck{c} -- ACK from c --> TimeWait
///
///   RST from either side, in any state ----------------------------------> Close
///   RST before any reply-direction packet -------------------------------> Aborted (over)
///   SYN (orig) in TimeWait or Close reopens ------------------------------> SynSent
/// ```
///
/// Entered from: `SynSent` from a new connection's SYN, or a reopening SYN in `TimeWait`/`Close`;
/// `SynReceived` from `SynSent`; `Established` from `SynReceived`; `FinWait` from `Established`
/// or `SynReceived`; `CloseWait` from `FinWait`; `LastAck` from `FinWait` or `CloseWait`;
/// `TimeWait` from `LastAck`; `Close` from every state; `Aborted` from every state but `Close`
/// by a reset while the reply side has sent nothing. Retransmissions keep the state, and so
/// do the segments Linux's conntrack ignores (passes without a transition): a SYN from the
/// original side once past the handshake, a SYN-ACK from the reply side once established or
/// closing, the reply side's ACK before its SYN-ACK. A FIN from either side in `SynReceived`
/// starts closing. Any other packet is [`CtError::Invalid`] and leaves the state unchanged.
/// Unlike Linux, a SYN from the reply side (simultaneous open, or reusing a `TimeWait` tuple
/// the other way round) is invalid.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TcpState {
    /// The original side sent SYN.
    SynSent,
    /// The reply side answered SYN-ACK.
    SynReceived,
    /// The original side acknowledged the SYN-ACK.
    Established,
    /// Side `closer` sent the first FIN.
    FinWait {
        /// The side that closed first.
        closer: CtDir,
    },
    /// The other side acknowledged `closer`'s FIN and may still send.
    CloseWait {
        /// The side that closed first.
        closer: CtDir,
    },
    /// Both sides sent FIN; `closer`'s final ACK is pending.
    LastAck {
        /// The side that closed first.
        closer: CtDir,
    },
    /// Both FINs acknowledged; waiting out stray segments.
    TimeWait,
    /// Reset.
    Close,
    /// Reset before the reply side ever answered: over at once (its timeout is zero), so
    /// lookups no longer find it and the expiry sweep removes it.
    Aborted,
}

/// The event a TCP segment's flags amount to, by precedence RST > SYN(-ACK) > FIN > ACK.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TcpEvent {
    Rst,
    Syn,
    SynAck,
    Fin,
    Ack,
    /// No SYN, ACK, FIN or RST: never valid.
    Null,
}

impl TcpEvent {
    fn of(flags: u8) -> TcpEvent {
        use tcp_flags::{ACK, FIN, RST, SYN};
        if flags & RST != 0 {
            TcpEvent::Rst
        } else if flags & SYN != 0 {
            if flags & ACK != 0 {
                TcpEvent::SynAck
            } else {
                TcpEvent::Syn
            }
        } else if flags & FIN != 0 {
            TcpEvent::Fin
        } else if flags & ACK != 0 {
            TcpEvent::Ack
        } else {
            TcpEvent::Null
        }
    }
}

impl TcpState {
    /// The state of a new connection whose first packet carries `flags`: only a SYN without ACK,
    /// RST or FIN opens one.
    pub fn open(flags: u8) -> Result<TcpState, CtError> {
        if TcpEvent::of(flags) == TcpEvent::Syn && flags & tcp_flags::FIN == 0 {
            Ok(TcpState::SynSent)
        } else {
            Err(CtError::Invalid)
        }
    }

    /// The state after a segment with `flags` travelling in `dir` (see the type's diagram).
    pub fn next(self, dir: CtDir, flags: u8) -> Result<TcpState, CtError> {
        use CtDir::{Original, Reply};
        use TcpEvent::{Ack, Fin, Null, Rst, Syn, SynAck};
        use TcpState::{
            Aborted, Close, CloseWait, Established, FinWait, LastAck, SynReceived, SynSent,
            TimeWait,
        };
        let ev = TcpEvent::of(flags);
        let invalid = Err(CtError::Invalid);
        // Cells marked "ignored" follow Linux's table (`nf_conntrack_proto_tcp.c`, sIG): the
        // segment passes and the state stays, e.g. a SYN on an established connection (a peer
        // that lost its state retrying; the receiver answers with a challenge ACK, RFC 5961
        // §4) or a late SYN-ACK retransmission while closing.
        match (self, ev, dir) {
            (SynSent, Rst, _) => Ok(Close),
            (SynSent, Syn, Original) => Ok(SynSent),
            (SynSent, SynAck, Reply) => Ok(SynReceived),
            // Ignored: the responder's ACK before its SYN-ACK.
            (SynSent, Ack, Reply) => Ok(SynSent),
            (SynSent, Syn | SynAck | Fin | Ack | Null, _) => invalid,

            (SynReceived, Rst, _) => Ok(Close),
            (SynReceived, Syn, Original) | (SynReceived, SynAck, Reply) => Ok(SynReceived),
            (SynReceived, Ack, Original) => Ok(Established),
            (SynReceived, Ack, Reply) => Ok(SynReceived),
            (SynReceived, Fin, d) => Ok(FinWait { closer: d }),
            (SynReceived, Syn | SynAck | Null, _) => invalid,

            (Established, Rst, _) => Ok(Close),
            (Established, Ack, _) | (Established, SynAck, Reply) => Ok(Established),
            // Ignored.
            (Established, Syn, Original) => Ok(Established),
            (Established, Fin, d) => Ok(FinWait { closer: d }),
            (Established, Syn | SynAck | Null, _) => invalid,

            (FinWait { .. }, Rst, _) => Ok(Close),
            (FinWait { closer }, Ack, d) if d == closer => Ok(FinWait { closer }),
            (FinWait { closer }, Ack, _) => Ok(CloseWait { closer }),
            (FinWait { closer }, Fin, d) if d == closer => Ok(FinWait { closer }),
            (FinWait { closer }, Fin, _) => Ok(LastAck { closer }),
            // Ignored.
            (s @ FinWait { .. }, Syn, Original) | (s @ FinWait { .. }, SynAck, Reply) => Ok(s),
            (FinWait { .. }, Syn | SynAck | Null, _) => invalid,

            (CloseWait { .. }, Rst, _) => Ok(Close),
            (CloseWait { closer }, Ack, _) => Ok(CloseWait { closer }),
            (CloseWait { closer }, Fin, d) if d == closer => Ok(CloseWait { closer }),
            (CloseWait { closer }, Fin, _) => Ok(LastAck { closer }),
            // Ignored.
            (s @ CloseWait { .. }, Syn, Original) | (s @ CloseWait { .. }, SynAck, Reply) => Ok(s),
            (CloseWait { .. }, Syn | SynAck | Null, _) => invalid,

            (LastAck { .. }, Rst, _) => Ok(Close),
            (LastAck { closer }, Ack, d) if d == closer => Ok(TimeWait),
            (LastAck { closer }, Ack | Fin, _) => Ok(LastAck { closer }),
            // Ignored.
            (s @ LastAck { .. }, Syn, Original) | (s @ LastAck { .. }, SynAck, Reply) => Ok(s),
            (LastAck { .. }, Syn | SynAck | Null, _) => invalid,

            (TimeWait, Rst, _) => Ok(Close),
            (TimeWait, Syn, Original) => Ok(SynSent),
            (TimeWait, Ack | Fin, _) => Ok(TimeWait),
            // Ignored.
            (TimeWait, SynAck, Reply) => Ok(TimeWait),
            (TimeWait, Syn | SynAck | Null, _) => invalid,

            (Close, Rst, _) => Ok(Close),
            (Close, Syn, Original) => Ok(SynSent),
            (Close, Ack | Fin, _) => Ok(Close),
            // Ignored.
            (Close, SynAck, Reply) => Ok(Close),
            (Close, Syn | SynAck | Null, _) => invalid,

            // Expired the moment it was entered, so no packet reaches it; should one, it is
            // treated as a closed connection's.
            (Aborted, Rst | Ack | Fin, _) | (Aborted, SynAck, Reply) => Ok(Aborted),
            (Aborted, Syn, Original) => Ok(SynSent),
            (Aborted, Syn | SynAck | Null, _) => invalid,
        }
    }
}

/// A connection's state.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CtState {
    /// A TCP connection.
    Tcp(TcpState),
    /// A UDP/ICMP/other pseudo-connection that has only seen original-direction packets.
    Unreplied,
    /// A pseudo-connection that has seen a reply.
    Replied,
}

/// One tracked connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Connection {
    zone: TenantId,
    orig: FlowKey,
    reply: FlowKey,
    state: CtState,
    created: Instant,
    last_seen: Instant,
    packets: [u64; 2],
    bytes: [u64; 2],
    tag: u64,
}

impl Connection {
    /// The tenant zone.
    pub fn zone(&self) -> TenantId {
        self.zone
    }
    /// The tuple of the first packet.
    pub fn orig(&self) -> FlowKey {
        self.orig
    }
    /// The tuple expected in the reply direction.
    pub fn reply(&self) -> FlowKey {
        self.reply
    }
    /// The tuple of direction `dir`.
    pub fn tuple(&self, dir: CtDir) -> FlowKey {
        match dir {
            CtDir::Original => self.orig,
            CtDir::Reply => self.reply,
        }
    }
    /// The current state.
    pub fn state(&self) -> CtState {
        self.state
    }
    /// When the connection was created.
    pub fn created(&self) -> Instant {
        self.created
    }
    /// The last accepted packet (or touch).
    pub fn last_seen(&self) -> Instant {
        self.last_seen
    }
    /// Packets accepted in direction `dir`.
    pub fn packets(&self, dir: CtDir) -> u64 {
        self.packets[dir.index()]
    }
    /// Bytes accepted in direction `dir`.
    pub fn bytes(&self, dir: CtDir) -> u64 {
        self.bytes[dir.index()]
    }
    /// The caller's opaque tag (the pipeline stores the SNAT binding to release on expiry).
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// The idle timeout of the connection's current state.
    pub fn timeout(&self, t: &Timeouts) -> Duration {
        match self.state {
            CtState::Tcp(TcpState::SynSent) => t.tcp_syn_sent,
            CtState::Tcp(TcpState::SynReceived) => t.tcp_syn_recv,
            CtState::Tcp(TcpState::Established) => t.tcp_established,
            CtState::Tcp(TcpState::FinWait { .. }) => t.tcp_fin_wait,
            CtState::Tcp(TcpState::CloseWait { .. }) => t.tcp_close_wait,
            CtState::Tcp(TcpState::LastAck { .. }) => t.tcp_last_ack,
            CtState::Tcp(TcpState::TimeWait) => t.tcp_time_wait,
            CtState::Tcp(TcpState::Close) => t.tcp_close,
            CtState::Tcp(TcpState::Aborted) => Duration::ZERO,
            CtState::Unreplied | CtState::Replied if is_icmp(self.orig.proto) => t.icmp,
            CtState::Unreplied => t.udp_unreplied,
            CtState::Replied => t.udp_replied,
        }
    }

    /// Whether the connection has been idle for its state's timeout at `now`.
    pub fn is_expired(&self, now: Instant, t: &Timeouts) -> bool {
        now.saturating_since(self.last_seen) >= self.timeout(t)
    }
}

/// A connection with every field public: what state sync carries from one plane to another
/// (the DPU's slow path and the spill plane each run their own tracker). [`Conntrack::adopt`]
/// installs it on the receiving side.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CtSnapshot {
    /// The tenant zone.
    pub zone: TenantId,
    /// The tuple of the first packet.
    pub orig: FlowKey,
    /// The tuple expected in the reply direction.
    pub reply: FlowKey,
    /// The state.
    pub state: CtState,
    /// When the connection was created.
    pub created: Instant,
    /// The last accepted packet.
    pub last_seen: Instant,
    /// Packets accepted, original then reply direction.
    pub packets: [u64; 2],
    /// Bytes accepted, original then reply direction.
    pub bytes: [u64; 2],
    /// The owner's opaque tag.
    pub tag: u64,
}

impl Connection {
    /// Every field, for state sync.
    pub fn snapshot(&self) -> CtSnapshot {
        CtSnapshot {
            zone: self.zone,
            orig: self.orig,
            reply: self.reply,
            state: self.state,
            created: self.created,
            last_seen: self.last_seen,
            packets: self.packets,
            bytes: self.bytes,
            tag: self.tag,
        }
    }
}

fn is_icmp(proto: u8) -> bool {
    proto == ip_proto::ICMP || proto == ip_proto::ICMPV6
}

/// Names a connection: slot plus generation. Valid until the connection is removed or expires.
/// Generations are `u32` and wrap: a handle held across 2^32 reuses of one slot could alias, far
/// beyond any flow entry's lifetime (entries are recomputed on every epoch change and idle out).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct CtHandle {
    /// Slab slot.
    pub slot: u32,
    /// The slot's generation when the connection was created.
    pub generation: u32,
}

/// Event counters.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct CtCounters {
    /// Connections created.
    pub created: u64,
    /// Connections that ended by timeout (swept by `expire` or reclaimed by `create`).
    pub expired: u64,
    /// Creates refused with [`CtError::Full`].
    pub rejected_full: u64,
    /// Packets refused with [`CtError::Invalid`] (by `create` or `update`).
    pub invalid: u64,
    /// Connections installed from another plane's snapshot ([`Conntrack::adopt`]).
    pub adopted: u64,
}

/// The connection tracker. See the module doc.
#[derive(Debug)]
pub struct Conntrack {
    config: ConntrackConfig,
    slots: Vec<Option<Connection>>,
    generations: Vec<u32>,
    free: Vec<u32>,
    /// `(slot << 1) | dir` for both tuples of every connection.
    index: HashTable<u32>,
    hasher: FixedState,
    expire_cursor: usize,
    counters: CtCounters,
}

fn pack(slot: u32, dir: CtDir) -> u32 {
    (slot << 1) | dir.index() as u32
}

fn unpack(e: u32) -> (u32, CtDir) {
    let dir = if e & 1 == 0 {
        CtDir::Original
    } else {
        CtDir::Reply
    };
    (e >> 1, dir)
}

fn key_hash(hasher: &FixedState, zone: TenantId, key: &FlowKey) -> u64 {
    hasher.hash_one((zone.0, key))
}

impl Conntrack {
    /// Builds an empty tracker and allocates all its memory.
    pub fn new(config: ConntrackConfig) -> Result<Conntrack, ConntrackConfigError> {
        let max = (u32::MAX >> 1) as usize;
        if config.capacity == 0 || config.capacity > max {
            return Err(ConntrackConfigError {
                actual: config.capacity,
                max,
            });
        }
        Ok(Conntrack {
            config,
            slots: vec![None; config.capacity],
            generations: vec![0; config.capacity],
            free: (0..config.capacity as u32).rev().collect(),
            index: HashTable::with_capacity(4 * config.capacity),
            hasher: FixedState::with_seed(config.hash_seed),
            expire_cursor: 0,
            counters: CtCounters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ConntrackConfig {
        &self.config
    }

    /// Connections held, expired-but-unswept ones included.
    pub fn len(&self) -> usize {
        self.config.capacity - self.free.len()
    }

    /// Whether no connection is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Maximum number of connections.
    pub fn capacity(&self) -> usize {
        self.config.capacity
    }

    /// Event counters.
    pub fn counters(&self) -> CtCounters {
        self.counters
    }

    fn find(&self, zone: TenantId, key: &FlowKey) -> Option<(u32, CtDir)> {
        self.find_hashed(key_hash(&self.hasher, zone, key), zone, key)
    }

    fn find_hashed(&self, h: u64, zone: TenantId, key: &FlowKey) -> Option<(u32, CtDir)> {
        self.index
            .find(h, |&e| {
                let (s, d) = unpack(e);
                let c = self.slots[s as usize]
                    .as_ref()
                    .expect("index names live slots");
                c.zone == zone && c.tuple(d) == *key
            })
            .map(|&e| unpack(e))
    }

    fn handle(&self, slot: u32) -> CtHandle {
        CtHandle {
            slot,
            generation: self.generations[slot as usize],
        }
    }

    /// The live, unexpired connection in `zone` with `key` as either tuple, and which tuple.
    pub fn lookup(&self, now: Instant, zone: TenantId, key: &FlowKey) -> Option<(CtHandle, CtDir)> {
        let (slot, dir) = self.find(zone, key)?;
        let c = self.slots[slot as usize]
            .as_ref()
            .expect("find returns live slots");
        if c.is_expired(now, &self.config.timeouts) {
            return None;
        }
        Some((self.handle(slot), dir))
    }

    /// The connection `h` names, expired or not; `None` if the handle is stale.
    pub fn get(&self, h: CtHandle) -> Option<&Connection> {
        if self.generations.get(h.slot as usize) != Some(&h.generation) {
            return None;
        }
        self.slots[h.slot as usize].as_ref()
    }

    /// Mutable access to a live, unexpired connection.
    fn live_mut(&mut self, now: Instant, h: CtHandle) -> Result<&mut Connection, CtError> {
        if self.generations.get(h.slot as usize) != Some(&h.generation) {
            return Err(CtError::Stale);
        }
        let timeouts = self.config.timeouts;
        match self.slots[h.slot as usize].as_mut() {
            Some(c) if !c.is_expired(now, &timeouts) => Ok(c),
            _ => Err(CtError::Stale),
        }
    }

    /// Tracks a new connection whose first packet (original direction) carries `tcp_flags`.
    ///
    /// A TCP connection must open with a SYN ([`TcpState::open`]), and an ICMP/ICMPv6 one with a
    /// query (echo request and the other types of [`IcmpKind::Request`]), else
    /// [`CtError::Invalid`]. `reply` is then the query's answer (`orig.reversed()` without NAT):
    /// same identifier, the reply type, so a request from the other side with the same
    /// identifier is a connection of its own and never this one's reply direction. A
    /// live connection owning `orig` or `reply` in `zone` gives [`CtError::Exists`]; an expired one
    /// is reclaimed. At capacity an expired connection is reclaimed if one is found within
    /// `reclaim_scan` slots, else [`CtError::Full`]. Every reclaimed connection is handed to
    /// `on_reclaimed` (so the caller can release its tag) and counted as expired. The first
    /// packet is not counted here: the caller accounts it with [`Conntrack::update`] like any other.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &mut self,
        now: Instant,
        zone: TenantId,
        orig: FlowKey,
        reply: FlowKey,
        tcp_flags: u8,
        tag: u64,
        mut on_reclaimed: impl FnMut(&Connection),
    ) -> Result<CtHandle, CtError> {
        let state = match orig.icmp_kind() {
            _ if orig.proto == ip_proto::TCP => match TcpState::open(tcp_flags) {
                Ok(s) => CtState::Tcp(s),
                Err(e) => {
                    self.counters.invalid += 1;
                    return Err(e);
                }
            },
            // As nf_conntrack's `valid_new`: only a query opens ICMP state. A reply, an error
            // or any other message would otherwise become an "original direction" that a
            // later request from the other side could ride.
            Some(IcmpKind::Reply | IcmpKind::Error | IcmpKind::Other) => {
                self.counters.invalid += 1;
                return Err(CtError::Invalid);
            }
            Some(IcmpKind::Request) | None => CtState::Unreplied,
        };
        // Each tuple is hashed once, for both the conflict check and the index insert.
        let hashes = [
            key_hash(&self.hasher, zone, &orig),
            key_hash(&self.hasher, zone, &reply),
        ];
        for (h, key) in hashes.into_iter().zip([orig, reply]) {
            if let Some((slot, _)) = self.find_hashed(h, zone, &key) {
                let c = self.slots[slot as usize]
                    .as_ref()
                    .expect("find returns live slots");
                if !c.is_expired(now, &self.config.timeouts) {
                    return Err(CtError::Exists);
                }
                let c = self.remove_slot(slot);
                self.counters.expired += 1;
                on_reclaimed(&c);
            }
        }
        let slot = self.alloc_slot(now, &mut on_reclaimed)?;
        self.slots[slot as usize] = Some(Connection {
            zone,
            orig,
            reply,
            state,
            created: now,
            last_seen: now,
            packets: [0, 0],
            bytes: [0, 0],
            tag,
        });
        self.index_insert(hashes[0], slot, CtDir::Original);
        if reply != orig {
            self.index_insert(hashes[1], slot, CtDir::Reply);
        }
        self.counters.created += 1;
        Ok(self.handle(slot))
    }

    /// A free slot, reclaiming an expired connection within `reclaim_scan` slots when the table
    /// is full; [`CtError::Full`] if none is found.
    fn alloc_slot(
        &mut self,
        now: Instant,
        on_reclaimed: &mut impl FnMut(&Connection),
    ) -> Result<u32, CtError> {
        if self.free.is_empty() {
            let cap = self.config.capacity;
            let mut reclaimed = None;
            for _ in 0..self.config.reclaim_scan.min(cap) {
                let slot = self.expire_cursor;
                self.expire_cursor = (self.expire_cursor + 1) % cap;
                if self.slots[slot]
                    .as_ref()
                    .is_some_and(|c| c.is_expired(now, &self.config.timeouts))
                {
                    reclaimed = Some(slot as u32);
                    break;
                }
            }
            let Some(slot) = reclaimed else {
                self.counters.rejected_full += 1;
                return Err(CtError::Full);
            };
            let c = self.remove_slot(slot);
            self.counters.expired += 1;
            on_reclaimed(&c);
        }
        Ok(self.free.pop().expect("a slot is free or was just freed"))
    }

    /// Installs a connection another plane tracked (state sync), replacing whatever this tracker
    /// holds under either of its tuples: the sender owns the connection, so its state wins. The
    /// snapshot's `last_seen` is kept unless this tracker saw the connection later. Replaced
    /// connections go to `on_replaced` (so the caller can release their tags). At capacity it
    /// reclaims an expired connection like [`Conntrack::create`], else [`CtError::Full`].
    pub fn adopt(
        &mut self,
        now: Instant,
        s: &CtSnapshot,
        mut on_replaced: impl FnMut(&Connection),
    ) -> Result<CtHandle, CtError> {
        let mut last_seen = s.last_seen;
        for key in [s.orig, s.reply] {
            if let Some((slot, _)) = self.find(s.zone, &key) {
                let c = self.remove_slot(slot);
                last_seen = last_seen.max(c.last_seen);
                on_replaced(&c);
            }
        }
        let slot = self.alloc_slot(now, &mut on_replaced)?;
        self.slots[slot as usize] = Some(Connection {
            zone: s.zone,
            orig: s.orig,
            reply: s.reply,
            state: s.state,
            created: s.created,
            last_seen,
            packets: s.packets,
            bytes: s.bytes,
            tag: s.tag,
        });
        let hashes = [
            key_hash(&self.hasher, s.zone, &s.orig),
            key_hash(&self.hasher, s.zone, &s.reply),
        ];
        self.index_insert(hashes[0], slot, CtDir::Original);
        if s.reply != s.orig {
            self.index_insert(hashes[1], slot, CtDir::Reply);
        }
        self.counters.adopted += 1;
        Ok(self.handle(slot))
    }

    fn index_insert(&mut self, h: u64, slot: u32, dir: CtDir) {
        let slots = &self.slots;
        let hasher = &self.hasher;
        self.index.insert_unique(h, pack(slot, dir), |&e| {
            let (s, d) = unpack(e);
            let c = slots[s as usize].as_ref().expect("index names live slots");
            key_hash(hasher, c.zone, &c.tuple(d))
        });
    }

    fn index_remove(&mut self, slot: u32, zone: TenantId, key: &FlowKey, dir: CtDir) {
        let h = key_hash(&self.hasher, zone, key);
        let packed = pack(slot, dir);
        match self.index.find_entry(h, |&e| e == packed) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => panic!("connection in slot {slot} missing from the index"),
        }
    }

    fn remove_slot(&mut self, slot: u32) -> Connection {
        let c = self.slots[slot as usize]
            .take()
            .expect("remove_slot is called on live slots");
        self.index_remove(slot, c.zone, &c.orig, CtDir::Original);
        if c.reply != c.orig {
            self.index_remove(slot, c.zone, &c.reply, CtDir::Reply);
        }
        self.generations[slot as usize] = self.generations[slot as usize].wrapping_add(1);
        self.free.push(slot);
        c
    }

    /// Accounts a packet of `bytes` in direction `dir` and advances the state. An invalid TCP
    /// segment leaves the connection untouched and returns [`CtError::Invalid`]; a handle whose
    /// connection is gone or expired returns [`CtError::Stale`].
    pub fn update(
        &mut self,
        now: Instant,
        h: CtHandle,
        dir: CtDir,
        tcp_flags: u8,
        bytes: u32,
    ) -> Result<CtState, CtError> {
        let c = self.live_mut(now, h)?;
        let next = match c.state {
            // A reset that is the only answer the connection ever got (no reply-direction
            // packet before it) aborts it: Linux's conntrack kills such an entry at once instead
            // of keeping it closing, so the tuple's next packet must open afresh (a SYN) or is
            // invalid, rather than riding the dead attempt's state.
            CtState::Tcp(s) => match s.next(dir, tcp_flags) {
                Ok(TcpState::Close)
                    if s != TcpState::Close && c.packets[CtDir::Reply.index()] == 0 =>
                {
                    CtState::Tcp(TcpState::Aborted)
                }
                Ok(n) => CtState::Tcp(n),
                Err(e) => {
                    self.counters.invalid += 1;
                    return Err(e);
                }
            },
            CtState::Unreplied | CtState::Replied => match dir {
                CtDir::Original => c.state,
                CtDir::Reply => CtState::Replied,
            },
        };
        c.state = next;
        c.packets[dir.index()] += 1;
        c.bytes[dir.index()] += u64::from(bytes);
        c.last_seen = c.last_seen.max(now);
        Ok(next)
    }

    /// Refreshes `last_seen` without a packet (e.g. the DPU reports hardware-path activity).
    pub fn touch(&mut self, now: Instant, h: CtHandle) -> Result<(), CtError> {
        let c = self.live_mut(now, h)?;
        c.last_seen = c.last_seen.max(now);
        Ok(())
    }

    /// Removes the connection `h` names (expired or not), returning it; `None` if stale.
    pub fn remove(&mut self, h: CtHandle) -> Option<Connection> {
        self.get(h)?;
        Some(self.remove_slot(h.slot))
    }

    /// Removes expired connections, handing each to `on_expired` in slot order from a cursor.
    /// Examines at most `budget` slots; returns the number removed.
    pub fn expire(
        &mut self,
        now: Instant,
        budget: usize,
        mut on_expired: impl FnMut(&Connection),
    ) -> usize {
        let cap = self.config.capacity;
        let mut n = 0;
        for _ in 0..budget.min(cap) {
            let slot = self.expire_cursor;
            self.expire_cursor = (self.expire_cursor + 1) % cap;
            if self.slots[slot]
                .as_ref()
                .is_some_and(|c| c.is_expired(now, &self.config.timeouts))
            {
                let c = self.remove_slot(slot as u32);
                on_expired(&c);
                n += 1;
            }
        }
        self.counters.expired += n as u64;
        n
    }

    /// Live connections with their handles, in slot order (control plane and tests only).
    pub fn iter(&self) -> impl Iterator<Item = (CtHandle, &Connection)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (self.handle(i as u32), c)))
    }

    /// Checks the tracker's invariants, returning the first violation. O(capacity).
    pub fn check_invariants(&self) -> Result<(), String> {
        let live = self.slots.iter().filter(|c| c.is_some()).count();
        if live + self.free.len() != self.config.capacity {
            return Err(format!(
                "live {live} + free {} != capacity {}",
                self.free.len(),
                self.config.capacity
            ));
        }
        for &s in &self.free {
            if self.slots[s as usize].is_some() {
                return Err(format!("free slot {s} is live"));
            }
        }
        let mut expected_index = 0;
        for (slot, c) in self.slots.iter().enumerate() {
            let Some(c) = c else { continue };
            let slot = slot as u32;
            if self.find(c.zone, &c.orig) != Some((slot, CtDir::Original)) {
                return Err(format!("slot {slot}: original tuple not indexed"));
            }
            expected_index += 1;
            if c.reply != c.orig {
                if self.find(c.zone, &c.reply) != Some((slot, CtDir::Reply)) {
                    return Err(format!("slot {slot}: reply tuple not indexed"));
                }
                expected_index += 1;
            }
            if c.last_seen < c.created {
                return Err(format!("slot {slot}: last_seen before created"));
            }
        }
        if self.index.len() != expected_index {
            return Err(format!(
                "index holds {} entries, expected {expected_index}",
                self.index.len()
            ));
        }
        Ok(())
    }
}
