//! Sequences of packets through two pipelines over the example policy, and the checks made
//! after every one of them: the fast path and the slow path give the same verdict and the same
//! bytes, both pipelines keep their invariants, and no frame from one tenant's VM leaves
//! toward another tenant's VM. Shared by `tests/path_equivalence.rs` (proptest strategies over
//! [`Flow`] and [`Op`]), the `pipeline_sequences` fuzz target (which includes this file and
//! `mod.rs` by `#[path]` and decodes its bytes with [`decode`]) and
//! `tests/sequence_fuzz_regressions.rs` (kept inputs and seeded random bytes through [`decode`]).

use super::*;
use core::time::Duration;
use spillway_vswitch::conntrack::ConntrackConfig;
use spillway_vswitch::flow_table::FlowTableConfig;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PortId, Verdict};
use spillway_wire::MacAddr;
use std::net::Ipv4Addr;

/// A sender: where its frames enter, its MAC and IP, and how to wrap them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    Vm(PortId, MacAddr, Ipv4Addr),
    /// A remote VM behind the remote VTEP, arriving VXLAN encapsulated.
    Overlay(Ipv4Addr),
    /// An internet host sending to a tenant's public address.
    Internet(Ipv4Addr),
}

pub const GLOBEX_PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 20);

pub const SRCS: [Src; 7] = [
    Src::Vm(WEB, WEB_MAC, WEB_IP),
    Src::Vm(WEB2, WEB2_MAC, WEB2_IP),
    Src::Vm(DB, DB_MAC, DB_IP),
    Src::Vm(GLOBEX, GLOBEX_MAC, WEB_IP),
    Src::Overlay(REMOTE_VM),
    Src::Overlay(Ipv4Addr::new(10, 2, 0, 6)),
    Src::Internet(ACME_PUBLIC),
];

pub const DSTS: [Ipv4Addr; 7] = [
    WEB_IP,
    WEB2_IP,
    DB_IP,
    REMOTE_VM,
    INTERNET_HOST,
    Ipv4Addr::new(10, 1, 255, 7), // blackhole
    Ipv4Addr::new(10, 1, 9, 9),   // local subnet, no VM
];

pub const FLAGS: [u8; 7] = [SYN, SYN | ACK, ACK, PSH | ACK, FIN | ACK, RST, RST | ACK];

/// One flow of a case: who opens it, toward which address, protocol and ports.
#[derive(Clone, Copy, Debug)]
pub struct Flow {
    pub src: Src,
    pub dst: Ipv4Addr,
    /// 0: TCP without payload, 1: TCP with payload, 2: UDP, 3: ICMP echo.
    pub kind: u8,
    pub sport: u16,
    pub dport: u16,
}

#[derive(Clone, Debug)]
pub enum Op {
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
    /// A packet of `flow` (PSH-ACK for TCP) whose innermost TTL is `ttl` (0..=2): the router
    /// answers TTL 0 and 1 with time exceeded, fast path or slow, and forwards TTL 2 as 1.
    Expiring {
        flow: usize,
        reply: bool,
        nat_guess: u16,
        ttl: u8,
    },
    Advance(u64),
    Expire,
    Reload,
}

/// The endpoint that answers for `ip` when `from` sent to it.
pub fn owner(ip: Ipv4Addr, from: Src) -> Src {
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
pub fn address(src: Src) -> Ipv4Addr {
    match src {
        Src::Vm(_, _, ip) | Src::Overlay(ip) => ip,
        Src::Internet(_) => INTERNET_HOST,
    }
}

/// Build a frame from `src` to `dst`, and the port it enters on.
#[allow(clippy::too_many_arguments)]
pub fn frame(
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
pub fn packet(f: &Flow, reply: bool, flags: u8, nat_guess: u16, spoof: bool) -> (PortId, Vec<u8>) {
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
pub fn policy_version(n: u32) -> Policy {
    if n.is_multiple_of(2) {
        return example_policy();
    }
    let text = EXAMPLE_POLICY
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

pub fn pair() -> (Pipeline, Pipeline) {
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

/// Flows per sequence: ops name them by index.
pub const FLOWS: usize = 8;
/// Ops one decoded input may run (keeps a fuzz input's cost bounded).
pub const OPS_MAX: usize = 512;

/// Decodes fuzz bytes: [`FLOWS`] flows of 5 bytes each (source, destination, kind, source port,
/// destination port; missing bytes read as 0), then ops of an opcode byte and its arguments
/// until the input or [`OPS_MAX`] ends. Every byte string decodes to something valid.
pub fn decode(data: &[u8]) -> (Vec<Flow>, Vec<Op>) {
    let mut bytes = data.iter().copied().peekable();
    let mut flows = Vec::with_capacity(FLOWS);
    for _ in 0..FLOWS {
        let f = [(); 5].map(|()| bytes.next().unwrap_or(0));
        flows.push(Flow {
            src: SRCS[usize::from(f[0]) % SRCS.len()],
            dst: DSTS[usize::from(f[1]) % DSTS.len()],
            kind: f[2] % 4,
            sport: [40000, 40001, 5432][usize::from(f[3]) % 3],
            dport: [22, 80, 5432, 1024][usize::from(f[4]) % 4],
        });
    }
    let mut ops = Vec::new();
    while ops.len() < OPS_MAX
        && let Some(code) = bytes.next()
    {
        let mut byte = || bytes.next().unwrap_or(0);
        let op = match code % 32 {
            0..16 => {
                let (f, x, nat) = (byte(), byte(), byte());
                Op::Packet {
                    flow: usize::from(f) % FLOWS,
                    reply: x & 0x80 != 0,
                    flags: usize::from(x & 0x7f) % FLAGS.len(),
                    nat_guess: u16::from(nat % 3),
                    // About 1 in 20, as the proptest strategy.
                    spoof: nat >= 243,
                }
            }
            16..20 => {
                let (f, nat) = (byte(), byte());
                Op::Handshake {
                    flow: usize::from(f) % FLOWS,
                    nat_guess: u16::from(nat % 3),
                }
            }
            20..23 => {
                let (f, x) = (byte(), byte());
                Op::Fragmented {
                    flow: usize::from(f) % FLOWS,
                    reply: x & 0x80 != 0,
                    nat_guess: u16::from(x % 3),
                    id: u16::from((x >> 2) & 3),
                    swap: x & 0x40 != 0,
                }
            }
            23..26 => {
                let (f, x) = (byte(), byte());
                Op::Expiring {
                    flow: usize::from(f) % FLOWS,
                    reply: x & 0x80 != 0,
                    nat_guess: u16::from(x % 3),
                    ttl: (x >> 2) % 3,
                }
            }
            26..29 => Op::Advance(1 + u64::from(byte()) * 2),
            29 => Op::Advance(20_000 + u64::from(byte()) * 700),
            30 => Op::Expire,
            _ => Op::Reload,
        };
        ops.push(op);
    }
    (flows, ops)
}

/// What a sequence did, for a caller's totals.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ran {
    /// Packets offered to each pipeline.
    pub packets: u64,
    /// Of those, fast-path hits in the pipeline with its fast path on.
    pub fast_path_hits: u64,
    /// Forwarded packets.
    pub forwarded: u64,
}

/// Runs `ops` over `flows` through a fast-path pipeline and a slow-path-only one at the same
/// times, checking after every packet that both agree on verdict and bytes, that invariants
/// hold (inside [`run`]) and that no VM's frame reaches another tenant's VM; at the end, that
/// both counted the same. An `Err` names the op and flow that broke a check.
pub fn check_sequence(flows: &[Flow], ops: &[Op]) -> Result<Ran, String> {
    let (mut a, mut b) = pair();
    let mut now = Instant(1_000_000_000);
    let mut reloads = 0u32;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Packet {
                flow,
                reply,
                flags,
                nat_guess,
                spoof,
            } => {
                let frame = packet(&flows[flow], reply, FLAGS[flags], nat_guess, spoof);
                offer(&mut a, &mut b, now, frame, &|| {
                    format!("op {i}: {op:?} of {:?}", flows[flow])
                })?;
            }
            Op::Handshake { flow, nat_guess } => {
                for (reply, flags) in [(false, SYN), (true, SYN | ACK), (false, ACK)] {
                    let frame = packet(&flows[flow], reply, flags, nat_guess, false);
                    offer(&mut a, &mut b, now, frame, &|| {
                        format!("op {i}: {op:?} of {:?}", flows[flow])
                    })?;
                }
            }
            Op::Fragmented {
                flow,
                reply,
                nat_guess,
                id,
                swap,
            } => {
                let (port, f) = packet(&flows[flow], reply, SYN, nat_guess, false);
                let mut frags = ipv4_fragments(&f, 14, 8, id);
                if swap && frags.len() > 1 {
                    frags.swap(0, 1);
                }
                let whole = frags.len() == 1;
                for f in frags {
                    let hits = a.counters().fast_path_hits;
                    offer(&mut a, &mut b, now, (port, f), &|| {
                        format!("op {i}: {op:?} of {:?}", flows[flow])
                    })?;
                    if !whole && a.counters().fast_path_hits > hits {
                        return Err(format!("a fragment hit a flow entry at op {i}: {op:?}"));
                    }
                }
            }
            Op::Expiring {
                flow,
                reply,
                nat_guess,
                ttl,
            } => {
                let (port, mut f) = packet(&flows[flow], reply, PSH | ACK, nat_guess, false);
                // The innermost IPv4 header: after the VXLAN outer headers for overlay senders.
                let l3 = if port == UPLINK
                    && f.len() > 64
                    && f[14 + 9] == 17
                    && f[36..38] == [0x12, 0xb5]
                {
                    64
                } else {
                    14
                };
                f[l3 + 8] = ttl;
                f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
                let c = spillway_wire::checksum::ipv4_header_checksum(&f[l3..l3 + 20]);
                f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
                offer(&mut a, &mut b, now, (port, f), &|| {
                    format!("op {i}: {op:?} of {:?}", flows[flow])
                })?;
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
    let (ca, cb) = (a.counters(), b.counters());
    if (ca.rx_packets, ca.forwarded) != (cb.rx_packets, cb.forwarded)
        || a.drops() != b.drops()
        || a.conntrack().len() != b.conntrack().len()
        || a.frag_counters() != b.frag_counters()
        || a.icmp_error_counters() != b.icmp_error_counters()
    {
        return Err(format!(
            "totals differ: {ca:?} vs {cb:?}, drops {:?} vs {:?}",
            a.drops(),
            b.drops()
        ));
    }
    Ok(Ran {
        packets: ca.rx_packets,
        fast_path_hits: ca.fast_path_hits,
        forwarded: ca.forwarded,
    })
}

/// Offers one frame to both pipelines and checks what became of it.
fn offer(
    a: &mut Pipeline,
    b: &mut Pipeline,
    now: Instant,
    (port, f): (PortId, Vec<u8>),
    at: &dyn Fn() -> String,
) -> Result<(), String> {
    let (va, oa, _) = run(a, now, port, &f);
    let (vb, ob, fast_b) = run(b, now, port, &f);
    if fast_b {
        return Err(format!(
            "the slow-path pipeline used a flow entry at {}",
            at()
        ));
    }
    if va != vb {
        return Err(format!("verdict differs ({va:?} vs {vb:?}) at {}", at()));
    }
    if oa != ob {
        return Err(format!("bytes differ at {}", at()));
    }
    if let Verdict::Forward(out) = va {
        let policy = a.policy();
        if let (Some(from), Some(to)) = (policy.port(port), policy.port(out))
            && from.tenant != to.tenant
        {
            return Err(format!(
                "tenant {:?}'s frame forwarded to tenant {:?}'s port {out:?} at {}",
                from.tenant,
                to.tenant,
                at()
            ));
        }
    }
    Ok(())
}
