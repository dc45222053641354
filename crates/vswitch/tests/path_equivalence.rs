//! Path equivalence: the fast path and the slow path produce the same verdict and the same output
//! bytes for the same packet under the same policy epoch.
//!
//! How: two pipelines over the example policy see the same random packet sequence at the same
//! times. Pipeline A runs normally (flow entries installed, later packets hit them); pipeline B
//! has its fast path off, so every packet walks the slow path against conntrack. After every
//! packet the verdicts and the bytes must be equal. The sequence mixes connection lifecycles
//! (TCP SYN/SYN-ACK/ACK/data/FIN/RST, UDP, ICMP echo) among local VMs, the overlay, and the
//! internet via SNAT, with spoofed frames, policy reloads (epoch bumps) and expiry sweeps in
//! between, so stale entries, recomputation, expired connections and SNAT reuse are all covered.
//! A's conntrack refresh interval is 0 here so both pipelines keep identical idle timers; with
//! the default interval an idle timer may lag by up to one interval (documented in pipeline.rs).
//! A second property checks that when a packet's repeat hits the entry its first copy installed,
//! the two outputs are identical. Fragmented packets (IPv4 fragments of 8 data bytes, in order or
//! with the first two swapped) are mixed in: they always take the slow path on both, and their
//! verdicts, bytes and fragment counters must agree too.

mod common;

use common::*;
use core::time::Duration;
use proptest::prelude::*;
use spillway_vswitch::conntrack::ConntrackConfig;
use spillway_vswitch::flow_table::FlowTableConfig;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PortId};
use spillway_wire::MacAddr;
use std::net::Ipv4Addr;

/// A sender: where its frames enter, its MAC and IP, and how to wrap them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Src {
    Vm(PortId, MacAddr, Ipv4Addr),
    /// A remote VM behind the remote VTEP, arriving VXLAN encapsulated.
    Overlay(Ipv4Addr),
    /// An internet host sending to a tenant's public address.
    Internet(Ipv4Addr),
}

const GLOBEX_PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 20);

const SRCS: [Src; 7] = [
    Src::Vm(WEB, WEB_MAC, WEB_IP),
    Src::Vm(WEB2, WEB2_MAC, WEB2_IP),
    Src::Vm(DB, DB_MAC, DB_IP),
    Src::Vm(GLOBEX, GLOBEX_MAC, WEB_IP),
    Src::Overlay(REMOTE_VM),
    Src::Overlay(Ipv4Addr::new(10, 2, 0, 6)),
    Src::Internet(ACME_PUBLIC),
];

const DSTS: [Ipv4Addr; 7] = [
    WEB_IP,
    WEB2_IP,
    DB_IP,
    REMOTE_VM,
    INTERNET_HOST,
    Ipv4Addr::new(10, 1, 255, 7), // blackhole
    Ipv4Addr::new(10, 1, 9, 9),   // local subnet, no VM
];

const FLAGS: [u8; 7] = [SYN, SYN | ACK, ACK, PSH | ACK, FIN | ACK, RST, RST | ACK];

/// One flow of a case: who opens it, toward which address, protocol and ports.
#[derive(Clone, Copy, Debug)]
struct Flow {
    src: Src,
    dst: Ipv4Addr,
    /// 0: TCP without payload, 1: TCP with payload, 2: UDP, 3: ICMP echo.
    kind: u8,
    sport: u16,
    dport: u16,
}

fn flow() -> impl Strategy<Value = Flow> {
    (0..SRCS.len(), 0..DSTS.len(), 0u8..4, 0usize..3, 0usize..4).prop_map(|(s, d, kind, sp, dp)| {
        Flow {
            src: SRCS[s],
            dst: DSTS[d],
            kind,
            sport: [40000, 40001, 5432][sp],
            dport: [22, 80, 5432, 1024][dp],
        }
    })
}

#[derive(Clone, Debug)]
enum Op {
    /// A packet of flow `flow` (index into the case's flows), in the reply direction if `reply`.
    /// `nat_guess` picks the SNAT port an internet reply is addressed to (the pools allocate
    /// from their lowest port upward, so small guesses hit live bindings).
    Packet {
        flow: usize,
        reply: bool,
        flags: usize,
        nat_guess: u16,
        spoof: bool,
    },
    /// SYN, SYN-ACK, ACK of flow `flow` (so established connections are common).
    Handshake {
        flow: usize,
        nat_guess: u16,
    },
    /// The packet of `flow` cut into IPv4 fragments with identification `id` (the whole VXLAN
    /// packet for overlay senders: outer fragments); `swap` sends the second fragment first.
    Fragmented {
        flow: usize,
        reply: bool,
        nat_guess: u16,
        id: u16,
        swap: bool,
    },
    Advance(u64),
    Expire,
    Reload,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        16 => (0usize..8, any::<bool>(), 0..FLAGS.len(), 0u16..3, prop::bool::weighted(0.05))
            .prop_map(|(flow, reply, flags, nat_guess, spoof)| Op::Packet { flow, reply, flags, nat_guess, spoof }),
        4 => (0usize..8, 0u16..3).prop_map(|(flow, nat_guess)| Op::Handshake { flow, nat_guess }),
        3 => (0usize..8, any::<bool>(), 0u16..3, 0u16..4, prop::bool::weighted(0.2))
            .prop_map(|(flow, reply, nat_guess, id, swap)| Op::Fragmented { flow, reply, nat_guess, id, swap }),
        3 => (1u64..500).prop_map(Op::Advance),
        1 => (20_000u64..200_000).prop_map(Op::Advance),
        1 => Just(Op::Expire),
        1 => Just(Op::Reload),
    ]
}

/// The endpoint that answers for `ip` when `from` sent to it.
fn owner(ip: Ipv4Addr, from: Src) -> Src {
    let tenant2 = matches!(from, Src::Vm(GLOBEX, ..));
    match ip {
        _ if tenant2 && ip == WEB_IP => Src::Vm(GLOBEX, GLOBEX_MAC, WEB_IP),
        _ if ip == WEB_IP => Src::Vm(WEB, WEB_MAC, WEB_IP),
        _ if ip == WEB2_IP => Src::Vm(WEB2, WEB2_MAC, WEB2_IP),
        _ if ip == DB_IP => Src::Vm(DB, DB_MAC, DB_IP),
        _ if ip.octets()[..2] == [10, 2] => Src::Overlay(ip),
        _ if tenant2 => Src::Internet(GLOBEX_PUBLIC),
        _ => Src::Internet(ACME_PUBLIC),
    }
}

/// The address of a sender as its peer sees it.
fn address(src: Src) -> Ipv4Addr {
    match src {
        Src::Vm(_, _, ip) | Src::Overlay(ip) => ip,
        Src::Internet(_) => INTERNET_HOST,
    }
}

/// Build a frame from `src` to `dst`, and the port it enters on.
#[allow(clippy::too_many_arguments)]
fn frame(
    src: Src,
    dst: Ipv4Addr,
    kind: u8,
    flags: u8,
    sport: u16,
    dport: u16,
    spoof: bool,
) -> (PortId, Vec<u8>) {
    let l4 = |smac, dmac, s: Ipv4Addr, d: Ipv4Addr, sp, dp| match kind {
        0 | 1 => tcp(
            smac,
            dmac,
            (s, sp),
            (d, dp),
            flags,
            if kind == 1 { b"data" } else { b"" },
        ),
        2 => udp(smac, dmac, (s, sp), (d, dp), b"dgram"),
        _ => ping(smac, dmac, s, d, sp, flags & ACK != 0),
    };
    match src {
        Src::Vm(port, mac, ip) => {
            let mac = if spoof {
                MacAddr([2, 9, 9, 9, 9, 9])
            } else {
                mac
            };
            (port, l4(mac, ACME_ROUTER, ip, dst, sport, dport))
        }
        Src::Overlay(ip) => {
            // A "spoofed" overlay frame is addressed to some other VTEP.
            let to = if spoof {
                Ipv4Addr::new(192, 0, 2, 99)
            } else {
                VTEP
            };
            let inner = l4(ACME_ROUTER, ACME_ROUTER, ip, dst, sport, dport);
            (UPLINK, vxlan(&inner, REMOTE_VTEP, to, ACME_VNI))
        }
        Src::Internet(public) => (
            UPLINK,
            l4(GATEWAY_MAC, UPLINK_MAC, INTERNET_HOST, public, sport, dport),
        ),
    }
}

/// The frame of one packet op.
fn packet(f: &Flow, reply: bool, flags: u8, nat_guess: u16, spoof: bool) -> (PortId, Vec<u8>) {
    if !reply {
        let dst = match f.src {
            Src::Internet(public) => public,
            _ => f.dst,
        };
        return frame(f.src, dst, f.kind, flags, f.sport, f.dport, spoof);
    }
    let from = owner(f.dst, f.src);
    let to = address(f.src);
    match from {
        Src::Internet(public) => {
            let base = if public == GLOBEX_PUBLIC { 20000 } else { 1024 };
            let port = base + nat_guess;
            // An ICMP echo reply carries the translated identifier.
            let sport = if f.kind == 3 { port } else { f.dport };
            frame(from, public, f.kind, flags, sport, port, spoof)
        }
        _ => frame(from, to, f.kind, flags, f.dport, f.sport, spoof),
    }
}

/// The example policy (even versions) or a variant of it (odd versions) in which acme's remote
/// segment moved to another VTEP and acme's router MAC changed.
fn policy_version(n: u32) -> Policy {
    if n.is_multiple_of(2) {
        return example_policy();
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/policy-basic.toml"
    );
    let text = std::fs::read_to_string(path).expect("example policy readable");
    let text = text
        .replace(
            "target = { tunnel = \"192.0.2.2\" }",
            "target = { tunnel = \"192.0.2.3\" }",
        )
        .replace(
            "router_mac = \"02:00:00:00:01:01\"",
            "router_mac = \"02:00:00:00:01:99\"",
        );
    Policy::from_toml_str(&text, "policy-variant.toml").expect("variant compiles")
}

fn pair() -> (Pipeline, Pipeline) {
    // Small tables keep the per-packet invariant checks cheap; eviction still never triggers
    // because a case creates at most a few hundred entries.
    let fast = PipelineConfig {
        ct_refresh: Duration::ZERO,
        flow_table: FlowTableConfig {
            capacity: 1024,
            ..FlowTableConfig::default()
        },
        conntrack: ConntrackConfig {
            capacity: 1024,
            ..ConntrackConfig::default()
        },
        ..PipelineConfig::default()
    };
    let slow = PipelineConfig {
        fast_path: false,
        ..fast.clone()
    };
    (pipeline(fast), pipeline(slow))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn fast_path_and_slow_path_agree_byte_for_byte(
        flows in prop::collection::vec(flow(), 8),
        ops in prop::collection::vec(op(), 1..150),
    ) {
        let (mut a, mut b) = pair();
        let mut now = Instant(1_000_000_000);
        let mut reloads = 0u32;
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Packet { flow, reply, flags, nat_guess, spoof } => {
                    let (port, f) = packet(&flows[flow], reply, FLAGS[flags], nat_guess, spoof);
                    let (va, oa, _) = run(&mut a, now, port, &f);
                    let (vb, ob, fast_b) = run(&mut b, now, port, &f);
                    prop_assert!(!fast_b, "B never uses a flow entry");
                    prop_assert_eq!(va, vb, "verdict differs at op {}: {:?} of {:?}", i, op, flows[flow]);
                    prop_assert_eq!(oa, ob, "bytes differ at op {}: {:?} of {:?}", i, op, flows[flow]);
                }
                Op::Handshake { flow, nat_guess } => {
                    for (reply, flags) in [(false, SYN), (true, SYN | ACK), (false, ACK)] {
                        let (port, f) = packet(&flows[flow], reply, flags, nat_guess, false);
                        let (va, oa, _) = run(&mut a, now, port, &f);
                        let (vb, ob, _) = run(&mut b, now, port, &f);
                        prop_assert_eq!(va, vb, "verdict differs at op {}: {:?} of {:?}", i, op, flows[flow]);
                        prop_assert_eq!(oa, ob, "bytes differ at op {}: {:?} of {:?}", i, op, flows[flow]);
                    }
                }
                Op::Fragmented { flow, reply, nat_guess, id, swap } => {
                    let (port, f) = packet(&flows[flow], reply, SYN, nat_guess, false);
                    let mut frags = ipv4_fragments(&f, 14, 8, id);
                    if swap && frags.len() > 1 {
                        frags.swap(0, 1);
                    }
                    for f in &frags {
                        let (va, oa, fast_a) = run(&mut a, now, port, f);
                        let (vb, ob, _) = run(&mut b, now, port, f);
                        prop_assert!(!fast_a || frags.len() == 1, "fragments never hit an entry");
                        prop_assert_eq!(va, vb, "verdict differs at op {}: {:?} of {:?}", i, op, flows[flow]);
                        prop_assert_eq!(oa, ob, "bytes differ at op {}: {:?} of {:?}", i, op, flows[flow]);
                    }
                }
                Op::Advance(ms) => now = now + Duration::from_millis(ms),
                Op::Expire => {
                    a.expire(now, 1 << 20);
                    b.expire(now, 1 << 20);
                }
                Op::Reload => {
                    // Alternate between the example and a variant whose routes and router MAC
                    // differ, so an entry used past its epoch would produce different bytes.
                    reloads += 1;
                    a.set_policy(policy_version(reloads));
                    b.set_policy(policy_version(reloads));
                }
            }
        }
        // Both saw the same traffic; A handled part of it on the fast path.
        prop_assert_eq!(a.counters().rx_packets, b.counters().rx_packets);
        prop_assert_eq!(a.counters().forwarded, b.counters().forwarded);
        prop_assert_eq!(a.drops(), b.drops());
        prop_assert_eq!(a.conntrack().len(), b.conntrack().len());
        prop_assert_eq!(a.frag_counters(), b.frag_counters());
    }

    #[test]
    fn a_repeated_packet_hitting_its_entry_is_rewritten_identically(f in flow()) {
        // A connection-opening packet: SYN for TCP, a request for UDP and ICMP.
        let (mut p, _) = pair();
        let (port, f) = packet(&f, false, SYN, 0, false);
        let (v1, o1, fast1) = run(&mut p, Instant(1), port, &f);
        let (v2, o2, fast2) = run(&mut p, Instant(2), port, &f);
        prop_assert!(!fast1);
        prop_assert_eq!(v1, v2);
        prop_assert_eq!(&o1, &o2);
        // Forwarded first packets install entries, so the repeat must be a hit.
        if matches!(v1, spillway_vswitch::Verdict::Forward(_)) {
            prop_assert!(fast2, "forwarded packet's repeat should hit its entry");
        }
    }
}
