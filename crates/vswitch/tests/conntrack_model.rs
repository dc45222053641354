//! Behavioural and differential tests of `Conntrack`.
//!
//! The unit tests walk the TCP state machine through real packet sequences (three-way handshake,
//! the six-packet DASH-style connection ending in TimeWait, four-way close, RST, invalid first
//! packets, retransmissions, reopening from TimeWait), drive every timeout purely through `now`,
//! and check the full-table, zone-isolation and handle-staleness rules. The proptest runs random
//! create / lookup / update / expire / time-advance sequences against a reference model (a
//! `BTreeMap` from `(zone, tuple)` to a connection record, with expiry as "idle for at least the
//! state's timeout") and requires identical results after every step: which lookups hit and in
//! which direction, which creates succeed or fail and why, `len` and counters. The tracker picks
//! which expired connection to reclaim or sweep (it walks a cursor); the model accepts any choice
//! as long as the connection handed back was expired, and fails if the tracker ever refuses a
//! create while an expired connection could have been reclaimed. The tracker's `check_invariants` runs after every step.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use spillway_vswitch::conntrack::{
    Conntrack, ConntrackConfig, CtDir, CtError, CtHandle, CtState, TcpState, Timeouts, tcp_flags,
};
use spillway_vswitch::{Instant, TenantId};
use spillway_wire::{FlowKey, IpAddr16, ip_proto};

use CtDir::{Original, Reply};
use tcp_flags::{ACK, FIN, PSH, RST, SYN};

const Z: TenantId = TenantId(1);

fn tuple(proto: u8, sport: u16) -> FlowKey {
    FlowKey {
        src_ip: IpAddr16::from_v4([10, 0, 0, 1]),
        dst_ip: IpAddr16::from_v4([10, 0, 0, 2]),
        src_port: sport,
        dst_port: 80,
        proto,
    }
}

fn ct(capacity: usize) -> Conntrack {
    Conntrack::new(ConntrackConfig {
        capacity,
        reclaim_scan: capacity,
        ..ConntrackConfig::default()
    })
    .expect("valid config")
}

fn secs(s: u64) -> Instant {
    Instant(s * 1_000_000_000)
}

fn no_reclaim(c: &spillway_vswitch::conntrack::Connection) {
    panic!("unexpected reclaim of {c:?}");
}

fn open_tcp(t: &mut Conntrack, now: Instant, sport: u16) -> CtHandle {
    let k = tuple(ip_proto::TCP, sport);
    t.create(now, Z, k, k.reversed(), SYN, 0, no_reclaim)
        .expect("SYN opens")
}

fn tcp(s: TcpState) -> Result<CtState, CtError> {
    Ok(CtState::Tcp(s))
}

#[test]
fn tcp_three_way_handshake_reaches_established() {
    let mut t = ct(4);
    let h = open_tcp(&mut t, secs(1), 1000);
    assert_eq!(
        t.get(h).map(|c| c.state()),
        Some(CtState::Tcp(TcpState::SynSent))
    );
    assert_eq!(
        t.update(secs(1), h, Original, SYN, 60),
        tcp(TcpState::SynSent)
    );
    assert_eq!(
        t.update(secs(1), h, Reply, SYN | ACK, 60),
        tcp(TcpState::SynReceived)
    );
    assert_eq!(
        t.update(secs(1), h, Original, ACK, 52),
        tcp(TcpState::Established)
    );
    assert_eq!(
        t.update(secs(2), h, Reply, ACK | PSH, 1000),
        tcp(TcpState::Established)
    );
    let c = t.get(h).expect("live");
    assert_eq!((c.packets(Original), c.bytes(Original)), (2, 112));
    assert_eq!((c.packets(Reply), c.bytes(Reply)), (2, 1060));
    assert_eq!(c.last_seen(), secs(2));
}

#[test]
fn tcp_six_packet_connection_ends_in_time_wait() {
    let mut t = ct(4);
    let h = open_tcp(&mut t, secs(1), 1000);
    let steps = [
        (Original, SYN, TcpState::SynSent),
        (Reply, SYN | ACK, TcpState::SynReceived),
        (Original, ACK, TcpState::Established),
        (Original, FIN | ACK, TcpState::FinWait { closer: Original }),
        (Reply, FIN | ACK, TcpState::LastAck { closer: Original }),
        (Original, ACK, TcpState::TimeWait),
    ];
    for (dir, flags, want) in steps {
        assert_eq!(
            t.update(secs(1), h, dir, flags, 60),
            tcp(want),
            "{dir:?} {flags:#x}"
        );
    }
    // Time-wait lasts 120 s by default.
    assert!(
        t.lookup(secs(120), Z, &tuple(ip_proto::TCP, 1000))
            .is_some()
    );
    assert!(
        t.lookup(secs(121), Z, &tuple(ip_proto::TCP, 1000))
            .is_none()
    );
}

#[test]
fn tcp_four_way_close_passes_close_wait() {
    let mut t = ct(4);
    let h = open_tcp(&mut t, secs(1), 1000);
    for (dir, flags) in [(Reply, SYN | ACK), (Original, ACK)] {
        t.update(secs(1), h, dir, flags, 0).expect("handshake");
    }
    assert_eq!(
        t.update(secs(2), h, Reply, FIN | ACK, 0),
        tcp(TcpState::FinWait { closer: Reply })
    );
    assert_eq!(
        t.update(secs(2), h, Original, ACK, 0),
        tcp(TcpState::CloseWait { closer: Reply })
    );
    assert_eq!(
        t.update(secs(3), h, Original, ACK | PSH, 10),
        tcp(TcpState::CloseWait { closer: Reply })
    );
    assert_eq!(
        t.update(secs(4), h, Original, FIN | ACK, 0),
        tcp(TcpState::LastAck { closer: Reply })
    );
    assert_eq!(t.update(secs(4), h, Reply, ACK, 0), tcp(TcpState::TimeWait));
}

#[test]
fn tcp_rst_closes_from_any_state() {
    let mut t = ct(4);
    let h = open_tcp(&mut t, secs(1), 1000);
    t.update(secs(1), h, Reply, SYN | ACK, 0).expect("syn-ack");
    assert_eq!(
        t.update(secs(1), h, Reply, RST | ACK, 0),
        tcp(TcpState::Close)
    );
    // Close lasts 10 s; a stray ACK keeps it closed, a new SYN reopens.
    assert_eq!(t.update(secs(2), h, Original, ACK, 0), tcp(TcpState::Close));
    assert_eq!(
        t.update(secs(3), h, Original, SYN, 0),
        tcp(TcpState::SynSent)
    );
    let states = [
        TcpState::SynSent,
        TcpState::SynReceived,
        TcpState::Established,
        TcpState::FinWait { closer: Original },
        TcpState::CloseWait { closer: Reply },
        TcpState::LastAck { closer: Original },
        TcpState::TimeWait,
        TcpState::Close,
    ];
    for s in states {
        for dir in [Original, Reply] {
            assert_eq!(s.next(dir, RST), Ok(TcpState::Close), "{s:?} {dir:?}");
        }
    }
}

#[test]
fn a_reset_as_the_only_answer_aborts_the_connection_at_once() {
    // Linux kills a conntrack entry whose only reply is a RST; the tuple then starts afresh.
    for dir in [Original, Reply] {
        let mut t = ct(4);
        let h = open_tcp(&mut t, secs(1), 1000);
        assert_eq!(
            t.update(secs(1), h, dir, RST | ACK, 0),
            tcp(TcpState::Aborted),
            "{dir:?}"
        );
        let k = tuple(ip_proto::TCP, 1000);
        assert_eq!(t.lookup(secs(1), Z, &k), None, "{dir:?}");
        assert_eq!(t.update(secs(1), h, Original, ACK, 0), Err(CtError::Stale));
        // A stray ACK cannot open it again; a SYN can (reclaiming the aborted entry's slot).
        assert_eq!(
            t.create(secs(1), Z, k, k.reversed(), ACK, 0, no_reclaim),
            Err(CtError::Invalid)
        );
        let mut reclaimed = 0;
        assert!(
            t.create(secs(1), Z, k, k.reversed(), SYN, 0, |_| reclaimed += 1)
                .is_ok()
        );
        assert_eq!(reclaimed, 1);
    }
}

#[test]
fn tcp_first_packet_without_bare_syn_is_invalid_and_counted() {
    let mut t = ct(4);
    let k = tuple(ip_proto::TCP, 1000);
    for flags in [ACK, SYN | ACK, FIN, RST, 0, SYN | FIN] {
        assert_eq!(
            t.create(secs(1), Z, k, k.reversed(), flags, 0, no_reclaim),
            Err(CtError::Invalid),
            "{flags:#x}"
        );
    }
    assert_eq!(t.counters().invalid, 6);
    assert!(t.is_empty());
}

#[test]
fn tcp_retransmitted_syn_keeps_state_and_invalid_segments_change_nothing() {
    let mut t = ct(4);
    let h = open_tcp(&mut t, secs(1), 1000);
    assert_eq!(
        t.update(secs(2), h, Original, SYN, 60),
        tcp(TcpState::SynSent)
    );
    assert_eq!(
        t.update(secs(2), h, Original, ACK, 60),
        Err(CtError::Invalid)
    );
    assert_eq!(t.update(secs(2), h, Reply, SYN, 60), Err(CtError::Invalid));
    let c = t.get(h).expect("live");
    assert_eq!(c.state(), CtState::Tcp(TcpState::SynSent));
    assert_eq!(c.packets(Original), 1, "invalid segments are not counted");
    assert_eq!(t.counters().invalid, 2);
    // A retransmitted SYN of the same tuple is not a new connection.
    let k = tuple(ip_proto::TCP, 1000);
    assert_eq!(
        t.create(secs(2), Z, k, k.reversed(), SYN, 0, no_reclaim),
        Err(CtError::Exists)
    );
    assert_eq!(t.lookup(secs(2), Z, &k), Some((h, Original)));
    assert_eq!(t.lookup(secs(2), Z, &k.reversed()), Some((h, Reply)));
}

#[test]
fn tcp_syn_in_time_wait_reopens() {
    assert_eq!(
        TcpState::TimeWait.next(Original, SYN),
        Ok(TcpState::SynSent)
    );
    assert_eq!(TcpState::TimeWait.next(Reply, SYN), Err(CtError::Invalid));
}

#[test]
fn timeouts_follow_the_state_and_are_driven_by_now() {
    let to = Timeouts::default();
    let mut t = ct(8);
    let h = open_tcp(&mut t, secs(0), 1);
    // SynSent: 120 s.
    assert!(t.lookup(secs(119), Z, &tuple(ip_proto::TCP, 1)).is_some());
    t.update(secs(119), h, Reply, SYN | ACK, 0)
        .expect("syn-ack");
    // SynReceived: 60 s from the last packet.
    assert!(t.lookup(secs(178), Z, &tuple(ip_proto::TCP, 1)).is_some());
    assert!(t.lookup(secs(179), Z, &tuple(ip_proto::TCP, 1)).is_none());
    assert_eq!(
        t.update(secs(179), h, Original, ACK, 0),
        Err(CtError::Stale)
    );

    let u = tuple(ip_proto::UDP, 2);
    let hu = t
        .create(secs(0), Z, u, u.reversed(), 0, 0, no_reclaim)
        .expect("udp");
    assert_eq!(t.get(hu).map(|c| c.state()), Some(CtState::Unreplied));
    assert!(
        t.lookup(
            secs(0) + (to.udp_unreplied - Duration::from_nanos(1)),
            Z,
            &u
        )
        .is_some()
    );
    t.update(secs(10), hu, Reply, 0, 100).expect("reply");
    assert_eq!(t.get(hu).map(|c| c.state()), Some(CtState::Replied));
    assert!(
        t.lookup(secs(10) + (to.udp_replied - Duration::from_nanos(1)), Z, &u)
            .is_some()
    );
    assert!(t.lookup(secs(10) + to.udp_replied, Z, &u).is_none());

    // An echo request (type 8, code 0) with identifier 7.
    let i = FlowKey {
        dst_port: 0x0800,
        ..tuple(ip_proto::ICMP, 7)
    };
    let hi = t
        .create(secs(0), Z, i, i.reversed(), 0, 0, no_reclaim)
        .expect("icmp");
    t.update(secs(0), hi, Reply, 0, 64).expect("echo reply");
    assert!(t.lookup(secs(29), Z, &i).is_some());
    assert!(
        t.lookup(secs(30), Z, &i).is_none(),
        "icmp: 30 s even when replied"
    );

    let mut tags = Vec::new();
    let n = t.expire(secs(10_000), 8, |c| tags.push(c.orig()));
    assert_eq!(n, 3);
    assert_eq!(t.counters().expired, 3);
    assert!(t.is_empty());
    t.check_invariants().expect("invariants");
}

#[test]
fn full_table_reclaims_expired_else_rejects_and_keeps_established() {
    let mut t = ct(2);
    let a = open_tcp(&mut t, secs(0), 1);
    t.update(secs(0), a, Reply, SYN | ACK, 0).expect("syn-ack");
    t.update(secs(0), a, Original, ACK, 0).expect("ack");
    let u = tuple(ip_proto::UDP, 9);
    t.create(secs(0), Z, u, u.reversed(), 0, 99, no_reclaim)
        .expect("udp");
    let k = tuple(ip_proto::TCP, 3);
    assert_eq!(
        t.create(secs(1), Z, k, k.reversed(), SYN, 0, no_reclaim),
        Err(CtError::Full)
    );
    assert_eq!(t.counters().rejected_full, 1);
    assert!(
        t.update(secs(1), a, Reply, ACK, 10).is_ok(),
        "established keeps working"
    );
    // After 30 s the unreplied UDP connection is reclaimed for the new one, its tag handed back.
    let mut released = Vec::new();
    let h = t.create(secs(31), Z, k, k.reversed(), SYN, 0, |c| {
        released.push(c.tag())
    });
    assert!(h.is_ok());
    assert_eq!(released, vec![99]);
    assert_eq!(t.counters().expired, 1);
    assert_eq!(t.len(), 2);
    t.check_invariants().expect("invariants");
}

#[test]
fn zones_isolate_identical_tuples() {
    let mut t = ct(4);
    let k = tuple(ip_proto::UDP, 5);
    let a = t
        .create(secs(0), TenantId(1), k, k.reversed(), 0, 1, no_reclaim)
        .expect("zone 1");
    let b = t
        .create(secs(0), TenantId(2), k, k.reversed(), 0, 2, no_reclaim)
        .expect("zone 2");
    assert_ne!(a, b);
    assert_eq!(t.lookup(secs(0), TenantId(1), &k), Some((a, Original)));
    assert_eq!(
        t.lookup(secs(0), TenantId(2), &k.reversed()),
        Some((b, Reply))
    );
    assert_eq!(t.lookup(secs(0), TenantId(3), &k), None);
}

#[test]
fn nat_reply_tuple_is_matched_in_reply_direction() {
    let mut t = ct(4);
    let orig = tuple(ip_proto::TCP, 4000);
    // SNAT: the reply comes back to the public address and port.
    let mut reply = orig.reversed();
    reply.dst_ip = IpAddr16::from_v4([203, 0, 113, 5]);
    reply.dst_port = 61000;
    let h = t
        .create(secs(0), Z, orig, reply, SYN, 61000, no_reclaim)
        .expect("create");
    assert_eq!(t.lookup(secs(0), Z, &reply), Some((h, Reply)));
    assert_eq!(t.lookup(secs(0), Z, &orig.reversed()), None);
    assert_eq!(t.get(h).map(|c| c.tag()), Some(61000));
}

#[test]
fn handle_is_stale_after_expiry_and_slot_reuse() {
    let mut t = ct(1);
    let u = tuple(ip_proto::UDP, 1);
    let h1 = t
        .create(secs(0), Z, u, u.reversed(), 0, 0, no_reclaim)
        .expect("create");
    assert_eq!(t.expire(secs(30), 1, |_| {}), 1);
    assert_eq!(t.get(h1), None);
    assert_eq!(t.update(secs(30), h1, Original, 0, 1), Err(CtError::Stale));
    let v = tuple(ip_proto::UDP, 2);
    let h2 = t
        .create(secs(31), Z, v, v.reversed(), 0, 0, no_reclaim)
        .expect("create");
    assert_eq!(h1.slot, h2.slot, "capacity 1 reuses the slot");
    assert_ne!(h1.generation, h2.generation);
    assert_eq!(t.touch(secs(31), h1), Err(CtError::Stale));
    assert_eq!(t.remove(h1), None);
    assert!(t.remove(h2).is_some());
    assert!(t.is_empty());
}

// ---- differential test ----

#[derive(Clone, Debug)]
struct ModelConn {
    zone: TenantId,
    orig: FlowKey,
    reply: FlowKey,
    state: CtState,
    last_seen: Instant,
    tag: u64,
}

#[derive(Default)]
struct Model {
    /// Connections by id; expired ones stay until the tracker hands them back.
    conns: BTreeMap<u64, ModelConn>,
    next_id: u64,
    expired: u64,
    created: u64,
    rejected_full: u64,
}

impl Model {
    fn expired(c: &ModelConn, now: Instant) -> bool {
        let t = Timeouts::default();
        let timeout = match c.state {
            CtState::Tcp(_) => t.tcp_syn_sent,
            CtState::Unreplied => t.udp_unreplied,
            CtState::Replied => t.udp_replied,
        };
        now - c.last_seen >= timeout
    }

    fn find(&self, zone: TenantId, k: &FlowKey) -> Option<(u64, CtDir)> {
        self.conns.iter().find_map(|(id, c)| {
            if c.zone != zone {
                None
            } else if c.orig == *k {
                Some((*id, Original))
            } else if c.reply == *k {
                Some((*id, Reply))
            } else {
                None
            }
        })
    }

    fn lookup(&self, now: Instant, zone: TenantId, k: &FlowKey) -> Option<(u64, CtDir)> {
        self.find(zone, k)
            .filter(|(id, _)| !Self::expired(&self.conns[id], now))
    }

    /// Removes a connection the tracker handed back (swept or reclaimed): it must be in the
    /// model and expired.
    fn take_expired(&mut self, now: Instant, zone: TenantId, orig: FlowKey, tag: u64) {
        let (id, dir) = self
            .find(zone, &orig)
            .expect("handed-back connection is in the model");
        assert_eq!(dir, Original);
        assert!(
            Self::expired(&self.conns[&id], now),
            "handed back before expiry"
        );
        assert_eq!(self.conns[&id].tag, tag);
        self.conns.remove(&id);
        self.expired += 1;
    }

    /// Creates after the tracker's reclaims were applied with `take_expired`; panics if the
    /// tracker failed to reclaim an expired connection it had to (conflict, or full with
    /// `reclaim_scan == capacity`).
    fn create(&mut self, now: Instant, c: ModelConn, capacity: usize) -> Result<u64, CtError> {
        for k in [c.orig, c.reply] {
            if let Some((id, _)) = self.find(c.zone, &k) {
                assert!(
                    !Self::expired(&self.conns[&id], now),
                    "expired conflict not reclaimed"
                );
                return Err(CtError::Exists);
            }
        }
        if self.conns.len() == capacity {
            assert!(
                self.conns.values().all(|c| !Self::expired(c, now)),
                "full table with an expired connection not reclaimed"
            );
            self.rejected_full += 1;
            return Err(CtError::Full);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.conns.insert(id, c);
        self.created += 1;
        Ok(id)
    }
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        zone: u32,
        a: u16,
        b: u16,
        tcp: bool,
    },
    Lookup {
        zone: u32,
        a: u16,
        b: u16,
    },
    Reply {
        zone: u32,
        a: u16,
        b: u16,
    },
    Expire(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let port = 0u16..6;
    let zone = 1u32..3;
    prop_oneof![
        4 => (zone.clone(), port.clone(), port.clone(), any::<bool>())
            .prop_map(|(zone, a, b, tcp)| Op::Create { zone, a, b, tcp }),
        3 => (zone.clone(), port.clone(), port.clone()).prop_map(|(zone, a, b)| Op::Lookup { zone, a, b }),
        2 => (zone, port.clone(), port).prop_map(|(zone, a, b)| Op::Reply { zone, a, b }),
        1 => (0usize..20).prop_map(Op::Expire),
        2 => (0u64..50).prop_map(Op::Advance),
    ]
}

/// The key space: ports `a -> b`, with the same address on both sides so some tuples are their
/// own reverse (a == b) and the "orig == reply" case is exercised.
fn key(a: u16, b: u16, tcp: bool) -> FlowKey {
    FlowKey {
        src_ip: IpAddr16::from_v4([10, 0, 0, 1]),
        dst_ip: IpAddr16::from_v4([10, 0, 0, 1]),
        src_port: a,
        dst_port: b,
        proto: if tcp { ip_proto::TCP } else { ip_proto::UDP },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn conntrack_matches_reference_model(capacity in 1usize..12, ops in prop::collection::vec(op(), 1..150)) {
        let mut t = ct(capacity);
        let mut m = Model::default();
        // Map model ids to tracker handles.
        let mut handles: BTreeMap<u64, CtHandle> = BTreeMap::new();
        let mut now = secs(1);
        for op in ops {
            match op {
                Op::Create { zone, a, b, tcp } => {
                    let k = key(a, b, tcp);
                    let z = TenantId(zone);
                    let tag = (u64::from(zone) << 32) | (u64::from(a) << 16) | u64::from(b);
                    let flags = if tcp { SYN } else { 0 };
                    let mut reclaimed = Vec::new();
                    let got = t.create(now, z, k, k.reversed(), flags, tag, |c| {
                        reclaimed.push((c.zone(), c.orig(), c.tag()));
                    });
                    prop_assert!(reclaimed.len() <= 3);
                    for (zone, orig, tag) in reclaimed {
                        m.take_expired(now, zone, orig, tag);
                    }
                    let state = if tcp { CtState::Tcp(TcpState::SynSent) } else { CtState::Unreplied };
                    let want = m.create(now, ModelConn { zone: z, orig: k, reply: k.reversed(), state, last_seen: now, tag }, capacity);
                    prop_assert_eq!(got.map(|_| ()), want.map(|_| ()));
                    if let (Ok(h), Ok(id)) = (got, want) {
                        handles.insert(id, h);
                    }
                }
                Op::Lookup { zone, a, b } => {
                    for tcp in [false, true] {
                        let k = key(a, b, tcp);
                        let got = t.lookup(now, TenantId(zone), &k);
                        let want = m.lookup(now, TenantId(zone), &k);
                        prop_assert_eq!(got, want.map(|(id, d)| (handles[&id], d)));
                        if let Some((h, _)) = got {
                            prop_assert_eq!(t.get(h).map(|c| c.tag()), want.map(|(id, _)| m.conns[&id].tag));
                        }
                    }
                }
                Op::Reply { zone, a, b } => {
                    // A UDP packet on the reply tuple: marks the connection replied.
                    let k = key(a, b, false).reversed();
                    if let Some((id, dir)) = m.lookup(now, TenantId(zone), &k) {
                        let h = handles[&id];
                        let c = m.conns.get_mut(&id).expect("found");
                        if dir == Reply {
                            c.state = CtState::Replied;
                        }
                        c.last_seen = now;
                        let want = c.state;
                        prop_assert_eq!(t.update(now, h, dir, 0, 10), Ok(want));
                    }
                }
                Op::Expire(budget) => {
                    let mut gone = Vec::new();
                    let n = t.expire(now, budget, |c| gone.push((c.zone(), c.orig(), c.tag())));
                    prop_assert!(n <= budget);
                    for (zone, orig, tag) in gone {
                        m.take_expired(now, zone, orig, tag);
                    }
                    if budget >= capacity {
                        // Full sweep: no expired connection is left on either side.
                        prop_assert!(m.conns.values().all(|c| !Model::expired(c, now)));
                    }
                }
                Op::Advance(dt) => now = now + Duration::from_secs(dt),
            }
            t.check_invariants().map_err(TestCaseError::fail)?;
            prop_assert_eq!(t.len(), m.conns.len());
            prop_assert_eq!(t.counters().expired, m.expired);
            prop_assert_eq!(t.counters().created, m.created);
            prop_assert_eq!(t.counters().rejected_full, m.rejected_full);
        }
    }
}
