//! From real frames to the fabric's vocabulary: which connection a frame belongs to
//! ([`ConnId`]), which side sent it, and what it does to the connection ([`Kind`]). The fabric
//! model reasons about connections and packet trains; a frame node offers it one train per
//! frame, built here.
//!
//! This is the DPU's classifier, the part of a NIC that reads a frame's tuple and TCP flags
//! before any software runs, and it must decide before the vSwitch does: whether the frame
//! goes to the fast path, the SoC or the spill plane depends on its `Kind`, and on the plane's
//! side the frame may never meet this side's conntrack at all. So it tracks only what that
//! decision needs (the first tuple, the FINs seen), not the TCP state machine, which stays the
//! vSwitch's conntrack's alone.
//!
//! A connection's id is a seeded hash of its tenant zone and its two endpoints in canonical
//! order, so both directions map to one id, as a DPU's symmetric RSS hash would. The table of
//! known connections is bounded (`conns_max`); at the limit a new connection is still classified
//! (as `Open`) but not remembered, and counted in [`ConnTableCounters::table_full`]: its later packets
//! are then unknown and the fabric counts them as `no_state` drops, which is what a full
//! connection table does on a real DPU.
//!
//! TCP: a SYN (without ACK) opens, also when repeated; SYN-ACK, FIN and handshake ACKs are
//! control; RST closes at once;
//! after both sides' FIN, the first closer's pure ACK closes. An unknown non-SYN segment is `Data` of an
//! unknown connection (a stray after a close, or a connection older than this process).
//! Other protocols: the first datagram opens, the rest are data.

use core::hash::BuildHasher;
use std::collections::HashMap;

use crate::types::{ConnId, Dest, Kind, Side, Train};
use foldhash::fast::FixedState;
use spillway_vswitch::{Instant, TenantId};
use spillway_wire::{FlowKey, ip_proto};

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const FIN: u8 = 0x01;
const RST: u8 = 0x04;

/// What the classifier remembers of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRecord {
    /// Tenant zone.
    pub zone: TenantId,
    /// The tuple of the first packet (the `Orig` side).
    pub orig: FlowKey,
    /// FIN seen from (orig, reply).
    pub fin: [bool; 2],
    /// The side whose FIN came first (0 orig, 1 reply), once one has.
    pub first_fin: Option<u8>,
    /// Last frame.
    pub last_seen: Instant,
}

spillway_vswitch::counters! {
    /// Classification counters (dotted names in [`ConnTableCounters::iter`]; a node reports
    /// them after its own, see [`super::FrameCounters::iter`]).
    #[derive(Copy, PartialEq, Eq)]
    pub struct ConnTableCounters {
        /// Connections opened.
        opened => "flows.opened",
        /// Connections closed (RST, or the ACK after both FINs).
        closed => "flows.closed",
        /// Segments of TCP connections this table does not know.
        unknown => "flows.unknown",
        /// Connections not remembered because the table was full.
        table_full => "flows.table_full",
        /// Connections forgotten after idling out.
        expired => "flows.expired",
    }
}

/// The connection table of one frame node.
#[derive(Debug)]
pub struct ConnTable {
    conns: HashMap<ConnId, ConnRecord, FixedState>,
    conns_max: usize,
    seed: FixedState,
    counters: ConnTableCounters,
    /// Connections the expiry sweep has still to look at in this pass (see [`ConnTable::expire`]).
    sweep: Vec<ConnId>,
}

/// The id of the connection `key` belongs to in `zone`, the same for both directions.
pub fn conn_id(hasher: &FixedState, zone: TenantId, key: &FlowKey) -> ConnId {
    // An ICMP reply's key names its type, not the request's: name the connection by the
    // request, so both directions still map to one id.
    let key = match key.icmp_kind() {
        Some(spillway_wire::icmp::IcmpKind::Reply) => key.reversed(),
        _ => *key,
    };
    let a = (key.src_ip, key.src_port);
    let b = (key.dst_ip, key.dst_port);
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    ConnId(hasher.hash_one((zone.0, key.proto, lo, hi)))
}

impl ConnTable {
    /// An empty table remembering at most `conns_max` connections.
    pub fn new(conns_max: usize) -> ConnTable {
        let seed = FixedState::with_seed(0x5b11_1a7e);
        ConnTable {
            conns: HashMap::with_capacity_and_hasher(conns_max.min(1 << 16), seed.clone()),
            conns_max,
            seed,
            counters: ConnTableCounters::default(),
            sweep: Vec::new(),
        }
    }

    /// Counters.
    pub fn counters(&self) -> &ConnTableCounters {
        &self.counters
    }

    /// Connections remembered.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is remembered.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The record of `conn`.
    pub fn get(&self, conn: ConnId) -> Option<&ConnRecord> {
        self.conns.get(&conn)
    }

    /// The id `key`'s connection has in `zone`.
    pub fn id_of(&self, zone: TenantId, key: &FlowKey) -> ConnId {
        conn_id(&self.seed, zone, key)
    }

    /// Remembers a connection learnt from the other plane (a state sync), so frames of it that
    /// arrive here later are classified as a known connection.
    pub fn learn(&mut self, now: Instant, zone: TenantId, orig: FlowKey) -> ConnId {
        let id = conn_id(&self.seed, zone, &orig);
        if self.conns.len() < self.conns_max || self.conns.contains_key(&id) {
            self.conns.entry(id).or_insert(ConnRecord {
                zone,
                orig,
                fin: [false; 2],
                first_fin: None,
                last_seen: now,
            });
        }
        id
    }

    /// The train of one frame of `bytes` bytes with 5-tuple `key` and TCP flags `flags`, from
    /// tenant `zone`, headed to `dest`.
    pub fn classify(
        &mut self,
        now: Instant,
        zone: TenantId,
        key: &FlowKey,
        flags: u8,
        bytes: u32,
        dest: Dest,
    ) -> Train {
        let conn = conn_id(&self.seed, zone, key);
        self.classify_as(now, conn, zone, key, (flags, bytes), dest)
    }

    /// [`ConnTable::classify`] of a frame whose connection the caller has already named
    /// (`conn`, which must be [`ConnTable::id_of`] `zone` and `key`): one hash per frame.
    pub fn classify_as(
        &mut self,
        now: Instant,
        conn: ConnId,
        zone: TenantId,
        key: &FlowKey,
        (flags, bytes): (u8, u32),
        dest: Dest,
    ) -> Train {
        debug_assert_eq!(conn, conn_id(&self.seed, zone, key), "{key:?}");
        let tcp = key.proto == ip_proto::TCP;
        let mut train = Train {
            conn,
            tenant: zone,
            side: Side::Orig,
            dest,
            kind: Kind::Data,
            packets: 1,
            packet_bytes: bytes,
            born: now,
            denied: false,
        };
        let Some(rec) = self.conns.get_mut(&conn) else {
            if tcp && (flags & (SYN | ACK | RST) != SYN) {
                self.counters.unknown += 1;
                return train;
            }
            train.kind = Kind::Open;
            self.counters.opened += 1;
            if self.conns.len() >= self.conns_max {
                self.counters.table_full += 1;
            } else {
                self.conns.insert(
                    conn,
                    ConnRecord {
                        zone,
                        orig: *key,
                        fin: [false; 2],
                        first_fin: None,
                        last_seen: now,
                    },
                );
            }
            return train;
        };
        rec.last_seen = now;
        let side = if *key == rec.orig {
            Side::Orig
        } else {
            Side::Reply
        };
        train.side = side;
        if !tcp {
            return train;
        }
        let s = usize::from(side == Side::Reply);
        train.kind = if flags & (SYN | ACK | RST) == SYN {
            // A SYN again: a retransmission (the fabric may have dropped the first at a limit,
            // and then does not know the connection) or a new connection on a reused tuple.
            // Either way it opens; for a connection the fabric knows, an open is a miss.
            rec.fin = [false; 2];
            rec.first_fin = None;
            Kind::Open
        } else if flags & RST != 0 {
            Kind::Close
        } else if flags & (SYN | FIN) != 0 {
            if flags & FIN != 0 {
                rec.fin[s] = true;
                rec.first_fin.get_or_insert(s as u8);
            }
            Kind::Control
        } else if rec.fin[0]
            && rec.fin[1]
            && rec.first_fin == Some(s as u8)
            && flags & ACK != 0
            && bytes_is_header_only(bytes)
        {
            // The first closer acknowledges the second FIN: the last packet of an orderly
            // close (in a simultaneous close the other side's ACK may still follow; it then
            // meets no state, a counted `no_state` drop that only a TIME_WAIT table would save).
            Kind::Close
        } else {
            Kind::Data
        };
        if train.kind == Kind::Close {
            self.conns.remove(&conn);
            self.counters.closed += 1;
        }
        train
    }

    /// Forgets `conn` (it closed).
    pub fn forget(&mut self, conn: ConnId) -> Option<ConnRecord> {
        self.conns.remove(&conn)
    }

    /// Forgets connections idle longer than `idle`; returns how many were forgotten. Each call
    /// examines at most `budget` connections, so the sweep never stalls the data path, and
    /// successive calls go round the whole table: a pass takes a snapshot of the ids (the only
    /// allocation, once per pass, off the per-packet path) and each call works through the next
    /// `budget` of them, skipping those gone meanwhile. A connection opened during a pass is
    /// looked at in the next one.
    pub fn expire(&mut self, now: Instant, idle: core::time::Duration, budget: usize) -> usize {
        let idle_ns = idle.as_nanos() as u64;
        if self.sweep.is_empty() {
            self.sweep.extend(self.conns.keys().copied());
        }
        let mut n = 0;
        for _ in 0..budget {
            let Some(id) = self.sweep.pop() else {
                break;
            };
            if self
                .conns
                .get(&id)
                .is_some_and(|c| now.0.saturating_sub(c.last_seen.0) >= idle_ns)
            {
                self.conns.remove(&id);
                n += 1;
            }
        }
        self.counters.expired += n as u64;
        n
    }
}

/// A pure ACK carries no payload: an Ethernet + IPv4 + TCP header is at most 14 + 60 + 60
/// bytes, and a minimal one is 54 (padded to 60 on the wire). Frames above the largest header
/// carry payload; frames within it are treated as header-only (a 1-byte payload at the end of a
/// teardown is vanishingly rare, and misreading it only closes the record one frame early).
fn bytes_is_header_only(bytes: u32) -> bool {
    bytes <= 14 + 60 + 60
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_wire::IpAddr16;

    fn key(sport: u16, dport: u16, proto: u8) -> FlowKey {
        FlowKey {
            src_ip: IpAddr16::from_v4([10, 0, 0, 1]),
            dst_ip: IpAddr16::from_v4([10, 0, 0, 2]),
            src_port: sport,
            dst_port: dport,
            proto,
        }
    }

    #[test]
    fn tcp_connection_lifecycle_maps_to_kinds() {
        let mut f = ConnTable::new(16);
        let z = TenantId(1);
        let k = key(4000, 80, ip_proto::TCP);
        let r = k.reversed();
        let t = |f: &mut ConnTable, k: &FlowKey, flags, bytes| {
            let t = f.classify(Instant(1), z, k, flags, bytes, Dest::Vm);
            (t.side, t.kind)
        };
        assert_eq!(t(&mut f, &k, SYN, 74), (Side::Orig, Kind::Open));
        assert_eq!(t(&mut f, &r, SYN | ACK, 74), (Side::Reply, Kind::Control));
        assert_eq!(t(&mut f, &k, ACK, 66), (Side::Orig, Kind::Data));
        assert_eq!(t(&mut f, &k, ACK, 1000), (Side::Orig, Kind::Data));
        assert_eq!(t(&mut f, &k, FIN | ACK, 66), (Side::Orig, Kind::Control));
        assert_eq!(t(&mut f, &r, FIN | ACK, 66), (Side::Reply, Kind::Control));
        assert_eq!(t(&mut f, &k, ACK, 66), (Side::Orig, Kind::Close));
        assert!(f.is_empty());
        // A stray retransmission after the close is unknown data.
        assert_eq!(t(&mut f, &r, FIN | ACK, 66), (Side::Orig, Kind::Data));
        assert_eq!(f.counters().unknown, 1);
        // Both directions map to one id.
        let id = conn_id(&f.seed, z, &k);
        assert_eq!(id, conn_id(&f.seed, z, &r));
        // Also for ICMP, whose reply key carries the reply type: an echo request (type 8) and
        // its reply share an id; a request from the other side with the same identifier does not.
        let ping = key(7, 0x0800, ip_proto::ICMP);
        let ping_id = conn_id(&f.seed, z, &ping);
        assert_eq!(ping_id, conn_id(&f.seed, z, &ping.reversed()));
        let back = FlowKey {
            src_ip: ping.dst_ip,
            dst_ip: ping.src_ip,
            ..ping
        };
        assert_ne!(ping_id, conn_id(&f.seed, z, &back));
        assert_ne!(id, conn_id(&f.seed, TenantId(2), &k));
    }

    #[test]
    fn rst_closes_and_udp_opens_on_first_datagram() {
        let mut f = ConnTable::new(16);
        let z = TenantId(1);
        let k = key(4000, 80, ip_proto::TCP);
        f.classify(Instant(0), z, &k, SYN, 74, Dest::Vm);
        let t = f.classify(Instant(0), z, &k.reversed(), RST | ACK, 60, Dest::Vm);
        assert_eq!(t.kind, Kind::Close);
        let u = key(5000, 53, ip_proto::UDP);
        assert_eq!(
            f.classify(Instant(0), z, &u, 0, 60, Dest::Vm).kind,
            Kind::Open
        );
        let back = f.classify(Instant(0), z, &u.reversed(), 0, 60, Dest::Vm);
        assert_eq!((back.side, back.kind), (Side::Reply, Kind::Data));
    }

    #[test]
    fn full_table_still_opens_but_forgets_and_idle_connections_expire() {
        let mut f = ConnTable::new(2);
        let z = TenantId(1);
        for p in 0..3 {
            let t = f.classify(Instant(0), z, &key(p, 53, ip_proto::UDP), 0, 60, Dest::Vm);
            assert_eq!(t.kind, Kind::Open);
        }
        assert_eq!((f.len(), f.counters().table_full), (2, 1));
        let s = core::time::Duration::from_secs(1);
        assert_eq!(f.expire(Instant(2_000_000_000), s, 100), 2);
        assert!(f.is_empty());
    }

    #[test]
    fn expiry_examines_at_most_its_budget_and_goes_round_the_whole_table() {
        let mut f = ConnTable::new(1 << 16);
        let z = TenantId(1);
        for p in 0..10_000u16 {
            f.classify(Instant(0), z, &key(p, 53, ip_proto::UDP), 0, 60, Dest::Vm);
        }
        // Four in five stay busy: a sweep that looked at the same first entries every time
        // would soon see only busy ones and never reach the idle fifth behind them.
        for p in (0..10_000u16).filter(|p| p % 5 != 0) {
            f.classify(
                Instant(5_000_000_000),
                z,
                &key(p, 53, ip_proto::UDP),
                0,
                60,
                Dest::Vm,
            );
        }
        let s = core::time::Duration::from_secs(1);
        let now = Instant(5_500_000_000);
        // A budget of 1,000 looks at 1,000 per call; three calls are not a whole pass.
        let first: usize = (0..3).map(|_| f.expire(now, s, 1_000)).sum();
        assert!(first < 2_000 && first > 0, "{first}");
        // Ten calls of 1,000 are one pass: every idle connection is gone, every busy one kept.
        let rest: usize = (0..7).map(|_| f.expire(now, s, 1_000)).sum();
        assert_eq!(first + rest, 2_000);
        assert_eq!(f.len(), 8_000);
        assert_eq!(f.counters().expired, 2_000);
    }
}
