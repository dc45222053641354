//! The DPU's frame node over one shard of the model (`DpuSwitch<ShardModel<_>>`, ADR 0011):
//! what each forwarding thread of a driver that shards runs, with its own classifier and
//! pipeline, all charging one `Resources`.
//!
//! - A shard's frame node forwards a connection with the same bytes as the whole node.
//! - Two forwarding threads, each with the frames of its own shard's connections, share one
//!   30 kpps fast path: together they get it, not 30 kpps each.
//! - A shard's node names a frame of another shard's connection from its own parse
//!   (`Outcome::Elsewhere`) and learns nothing of it, so a driver parses each frame once.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use spillway_fabric::dpu::{DpuControl, DpuShard, Resources, shard_of};
use spillway_fabric::frame::{CONNS_MAX, DpuSwitch, Outcome, ShardModel};
use spillway_fabric::params::FabricParams;
use spillway_vswitch::pipeline::PipelineConfig;
use spillway_vswitch::{Instant, PortId};
use spillway_wire::build::FrameBuilder;
use spillway_wire::{FlowKey, IpAddr16, ip_proto};

const PSH: u8 = 0x08;

#[path = "common/acme.rs"]
#[allow(dead_code, reason = "each test file uses part of it")]
mod acme;
#[path = "common/locked.rs"]
mod locked;
use acme::*;
use locked::{Locked, resources};

/// A forwarding thread's frame node: one shard, seeing the lifecycle as a fresh control part
/// does (idle, no plane).
fn shard_switch(f: &FabricParams, res: &Arc<Mutex<Resources>>) -> DpuSwitch<ShardModel<Locked>> {
    let shard = DpuShard::with_resources(f, Locked(Arc::clone(res)));
    let model = ShardModel::new(shard, DpuControl::new(f).view());
    DpuSwitch::with_model(model, policy(), PipelineConfig::default(), CONNS_MAX)
        .expect("valid config")
}

/// A TCP segment from WEB2's port `sport` to WEB's port 80 (`to_web`), or back.
fn tcp(sport: u16, to_web: bool, flags: u8) -> (PortId, Vec<u8>) {
    let b = FrameBuilder::new();
    let b = if to_web {
        b.eth(WEB2_MAC, ACME_ROUTER)
            .ipv4(WEB2_IP, WEB_IP)
            .tcp(sport, 80)
    } else {
        b.eth(WEB_MAC, ACME_ROUTER)
            .ipv4(WEB_IP, WEB2_IP)
            .tcp(80, sport)
    };
    let payload: &[u8] = if flags & SYN != 0 {
        b""
    } else {
        b"GET / HTTP/1.1\r\n\r\n"
    };
    let frame = b
        .tcp_flags(flags)
        .seq(if to_web { 100 } else { 500 })
        .ack(u32::from(flags & ACK != 0))
        .payload(payload)
        .build();
    (if to_web { WEB2 } else { WEB }, frame)
}

fn key(sport: u16) -> FlowKey {
    FlowKey {
        src_ip: IpAddr16::from_v4(WEB2_IP.octets()),
        dst_ip: IpAddr16::from_v4(WEB_IP.octets()),
        src_port: sport,
        dst_port: 80,
        proto: ip_proto::TCP,
    }
}

fn handshake(sport: u16) -> Vec<(PortId, Vec<u8>)> {
    vec![
        tcp(sport, true, SYN),
        tcp(sport, false, SYN | ACK),
        tcp(sport, true, ACK),
    ]
}

/// Forwarded bytes (and out port) of each frame, or `None` where it was not forwarded.
fn forwarded(outcome: Outcome<'_>) -> Option<(PortId, Vec<u8>)> {
    match outcome {
        Outcome::Forward { port, bytes, .. } => Some((port, bytes.to_vec())),
        _ => None,
    }
}

#[test]
fn a_shard_frame_node_forwards_what_the_whole_node_forwards() {
    let f = FabricParams::default();
    let mut whole =
        DpuSwitch::new(&f, policy(), PipelineConfig::default(), CONNS_MAX).expect("valid");
    let mut shard = shard_switch(&f, &resources(&f));
    let mut frames = handshake(40_000);
    frames.push(tcp(40_000, true, ACK | PSH));
    frames.push(tcp(40_000, false, ACK | PSH));
    for (i, (port, frame)) in frames.iter().enumerate() {
        let now = Instant(1_000_000 * (i as u64 + 1));
        let a = forwarded(whole.process(now, *port, 0, frame));
        let b = forwarded(shard.process(now, *port, 0, frame));
        assert!(a.is_some(), "frame {i} forwarded by the whole node");
        assert_eq!(a, b, "frame {i}");
    }
    let (w, s) = (whole.dpu().counters(), shard.dpu().shard().counters());
    assert_eq!(
        w.soc_delivered + w.hw_delivered,
        s.soc_delivered + s.hw_delivered
    );
}

const FAST_PATH_PPS: f64 = 30_000.0;
const QUEUE: u32 = 32;
const STEPS_MS: u64 = 1_000;
/// Data segments each thread offers per ms: 40 kpps each, 80 kpps in all.
const PER_MS: u64 = 40;

/// Strict turns between threads: step `s` goes once every step before it has gone, so the
/// shared fast path sees the threads' frames in the order of their times whatever the
/// scheduler does (with a barrier per millisecond instead, one thread could run its whole
/// millisecond first and take all of it, and the split between the threads was the
/// scheduler's).
#[derive(Default)]
struct Turns {
    next: Mutex<u64>,
    moved: Condvar,
}

impl Turns {
    fn wait(&self, step: u64) {
        let mut next = self.next.lock().unwrap();
        while *next != step {
            next = self.moved.wait(next).unwrap();
        }
    }

    fn done(&self) {
        *self.next.lock().unwrap() += 1;
        self.moved.notify_all();
    }
}

#[test]
fn two_forwarding_threads_share_one_fast_path() {
    let mut f = FabricParams::default();
    f.dpu.hw_pps_limit = FAST_PATH_PPS;
    f.dpu.hw_queue_packets = QUEUE;
    f.dpu_only = true;
    f.validate().expect("valid parameters");
    let res = resources(&f);
    // 64 connections, each on the thread of its shard, as the driver would hand them over.
    let ids = shard_switch(&f, &res);
    let mut ports: [Vec<u16>; 2] = [Vec::new(), Vec::new()];
    for sport in 40_000..40_064 {
        let conn = ids.conns().id_of(ACME, &key(sport));
        ports[shard_of(conn, f.dpu.redirect_buckets, 2)].push(sport);
    }
    drop(ids);
    assert!(ports.iter().all(|p| !p.is_empty()), "{ports:?}");
    let turns = Arc::new(Turns::default());
    let threads: Vec<_> = ports
        .into_iter()
        .enumerate()
        .map(|(k, ports)| {
            let (f, res, turns) = (f.clone(), Arc::clone(&res), Arc::clone(&turns));
            thread::spawn(move || {
                let mut sw = shard_switch(&f, &res);
                let timers = |sw: &mut DpuSwitch<ShardModel<Locked>>, now: Instant| {
                    if sw.poll_timeout().is_some_and(|t| t <= now) {
                        sw.dpu_mut().shard_mut().complete_due_inserts(now);
                    }
                };
                for sport in &ports {
                    for (port, frame) in handshake(*sport) {
                        let _ = sw.process(Instant(0), port, 0, &frame);
                    }
                }
                let data: Vec<(PortId, Vec<u8>)> =
                    ports.iter().map(|p| tcp(*p, true, ACK | PSH)).collect();
                let mut out = 0u64;
                let mut next = 0;
                for m in 1..=STEPS_MS {
                    for j in 0..PER_MS {
                        // The two threads' frames interleave in time, and go in that order.
                        let step = ((m - 1) * PER_MS + j) * 2 + k as u64;
                        let now = Instant(m * 1_000_000 + (j * 2 + k as u64) * 12_500);
                        turns.wait(step);
                        timers(&mut sw, now);
                        let (port, frame) = &data[next];
                        next = (next + 1) % data.len();
                        if forwarded(sw.process(now, *port, 0, frame)).is_some() {
                            out += 1;
                        }
                        turns.done();
                    }
                }
                let c = *sw.dpu().shard().counters();
                (out, c.hw_delivered, c.soc_delivered, 3 * ports.len() as u64)
            })
        })
        .collect();
    let results: Vec<(u64, u64, u64, u64)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let hw: u64 = results.iter().map(|r| r.1).sum();
    let most = (FAST_PATH_PPS as u64) * STEPS_MS / 1_000 + u64::from(QUEUE);
    assert!(
        hw <= most,
        "the fast path delivered {hw} > {most}: {results:?}"
    );
    assert!(hw >= most * 95 / 100, "only {hw}: {results:?}");
    for (k, (out, hw, soc, handshakes)) in results.iter().enumerate() {
        assert!(
            *hw > most / 4,
            "thread {k} got {hw} of the fast path: {results:?}"
        );
        // Every data segment the model delivered left the pipeline (the rest of what it
        // delivered is the handshakes).
        assert!(
            *out <= hw + soc && out + handshakes >= hw + soc,
            "thread {k}: {results:?}"
        );
    }
}

/// Shard 0 of two, as a forwarding thread holds it: the node names a frame of shard 1's
/// connection from its own parse and hands it back untouched.
fn placed_switch(f: &FabricParams, res: &Arc<Mutex<Resources>>) -> DpuSwitch<ShardModel<Locked>> {
    let shard = DpuShard::with_resources(f, Locked(Arc::clone(res)));
    let place = (0, 2, f.dpu.redirect_buckets);
    let model = ShardModel::placed(shard, DpuControl::new(f).view(), place);
    DpuSwitch::with_model(model, policy(), PipelineConfig::default(), CONNS_MAX)
        .expect("valid config")
}

#[test]
fn another_shards_frame_comes_back_from_the_nodes_own_parse_untouched() {
    let f = FabricParams::default();
    let res = resources(&f);
    let mut sw = placed_switch(&f, &res);
    let shard = |sport| {
        let conn = sw.conns().id_of(ACME, &key(sport));
        shard_of(conn, f.dpu.redirect_buckets, 2)
    };
    let theirs = (40_000..41_000)
        .find(|&p| shard(p) == 1)
        .expect("a port of shard 1");
    let mine = (40_000..41_000)
        .find(|&p| shard(p) == 0)
        .expect("a port of shard 0");
    // Both directions of shard 1's connection: named, not served, nothing learnt.
    for (i, (port, frame)) in handshake(theirs).into_iter().enumerate() {
        let now = Instant(1_000_000 * (i as u64 + 1));
        assert_eq!(
            sw.process(now, port, 0, &frame),
            Outcome::Elsewhere { shard: 1 }
        );
    }
    assert_eq!(sw.conns().len(), 0, "nothing was learnt");
    let c = sw.dpu().shard().counters();
    assert_eq!((c.soc_delivered, c.hw_delivered), (0, 0));
    // Its own connection it serves.
    for (i, (port, frame)) in handshake(mine).into_iter().enumerate() {
        let now = Instant(10_000_000 + 1_000_000 * i as u64);
        assert!(
            forwarded(sw.process(now, port, 0, &frame)).is_some(),
            "frame {i}"
        );
    }
    assert_eq!(sw.conns().len(), 1);
    // A frame of no connection is any shard's: served (or dropped) where it arrived.
    let arp = FrameBuilder::new()
        .eth(WEB2_MAC, spillway_wire::MacAddr::BROADCAST)
        .arp(
            1,
            WEB2_IP.octets(),
            spillway_wire::MacAddr([0; 6]),
            WEB_IP.octets(),
        )
        .build();
    let now = Instant(20_000_000);
    assert!(!matches!(
        sw.process(now, WEB2, 0, &arp),
        Outcome::Elsewhere { .. }
    ));
    assert!(matches!(
        sw.process(now, WEB2, 0, &[0u8; 7]),
        Outcome::Drop(_)
    ));
}
