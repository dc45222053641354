//! The frame-level nodes (`DpuSwitch`, `PlaneSwitch`) joined back to back with no I/O, as the
//! real-time driver joins them over rings: every frame goes in by one call and comes out as one
//! outcome. Proves that a connection steered through the plane leaves with the same bytes as
//! one the DPU serves alone (path equivalence), that both pipelines hold the same TCP state
//! after the hand-over rules ran (state continuity: mirrors, conntrack changes and their
//! order), that a copy's snapshot never replaces the owner's, that records without packets are
//! refused and counted, that a forwarding node allocates nothing per frame once warm, and that
//! the plane's node over one shard of the plane serves a steered frame as the whole plane does;
//! with warm standby, that the warm plane's bulk sync carries the DPU's snapshots and that a
//! fenced plane's snapshot never replaces the DPU's copy.

use spillway_fabric::dpu::{Role, Sender};
use spillway_fabric::frame::{
    CONNS_MAX, DpuSwitch, FrameDrop, Outcome, Outgoing, Pair, PlaneSwitch,
};
use spillway_fabric::params::FabricParams;
use spillway_fabric::types::{Msg, PlaneSlot, SyncKind};
use spillway_vswitch::pipeline::PipelineConfig;
use spillway_vswitch::{Instant, PacketBuf, PortId};
use spillway_wire::build::FrameBuilder;
use spillway_wire::{FlowKey, IpAddr16, MacAddr, ip_proto};
use std::net::Ipv4Addr;

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

#[path = "common/acme.rs"]
#[allow(dead_code, reason = "each test file uses part of it")]
mod acme;
use acme::*;

fn at(ms: u64) -> Instant {
    Instant(ms * 1_000_000)
}

fn dpu() -> DpuSwitch {
    DpuSwitch::new(
        &FabricParams::default(),
        policy(),
        PipelineConfig::default(),
        CONNS_MAX,
    )
    .expect("valid config")
}

fn plane() -> PlaneSwitch {
    PlaneSwitch::new(
        &FabricParams::default(),
        policy(),
        PipelineConfig::default(),
        CONNS_MAX,
    )
    .expect("valid config")
}

/// A TCP segment from `src` to `dst` (each a MAC, an address and a port), through acme's
/// router.
fn tcp(src: (MacAddr, Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8, seq: u32) -> Vec<u8> {
    FrameBuilder::new()
        .eth(src.0, ACME_ROUTER)
        .ipv4(src.1, dst.0)
        .tcp(src.2, dst.1)
        .tcp_flags(flags)
        .seq(seq)
        .ack(if flags & ACK != 0 { 1 } else { 0 })
        .payload(if flags & SYN != 0 {
            b""
        } else {
            b"GET / HTTP/1.1\r\n\r\n"
        })
        .build()
}

/// WEB2 opening a connection to WEB's port 80: SYN, SYN-ACK, ACK, and data each way, as
/// (ingress port, frame).
fn handshake() -> Vec<(PortId, Vec<u8>)> {
    let c = (WEB2_MAC, WEB2_IP, 40_000);
    let s = (WEB_MAC, WEB_IP, 80);
    vec![
        (WEB2, tcp(c, (WEB_IP, 80), SYN, 100)),
        (WEB, tcp(s, (WEB2_IP, 40_000), SYN | ACK, 500)),
        (WEB2, tcp(c, (WEB_IP, 80), ACK, 101)),
        (WEB2, tcp(c, (WEB_IP, 80), ACK | 0x08, 101)),
        (WEB, tcp(s, (WEB2_IP, 40_000), ACK | 0x08, 501)),
    ]
}

fn key() -> FlowKey {
    FlowKey {
        src_ip: IpAddr16::from_v4(WEB2_IP.octets()),
        dst_ip: IpAddr16::from_v4(WEB_IP.octets()),
        src_port: 40_000,
        dst_port: 80,
        proto: ip_proto::TCP,
    }
}

/// A DPU and a plane with every redirect bucket live.
fn active_pair() -> (Pair, Instant) {
    let mut pair = Pair::new(dpu(), plane());
    let now = pair.activate(at(1)).expect("the plane activates");
    (pair, now)
}

#[test]
fn a_connection_through_the_plane_leaves_with_the_bytes_the_dpu_alone_gives_it() {
    // The DPU alone.
    let mut alone = dpu();
    let mut expected = Vec::new();
    for (i, (port, f)) in handshake().into_iter().enumerate() {
        match alone.process(at(1 + i as u64), port, 0, &f) {
            Outcome::Forward {
                port,
                bytes,
                generated,
            } => {
                assert!(!generated);
                expected.push((port, bytes.to_vec()));
            }
            other => panic!("frame {i}: {other:?}"),
        }
    }
    assert_eq!(expected[0].0, WEB);
    assert_eq!(expected[1].0, WEB2);

    // Through the plane.
    let (mut pair, start) = active_pair();
    for (i, (port, f)) in handshake().into_iter().enumerate() {
        let now = Instant(start.0 + i as u64 * 1_000_000);
        let t = pair.process(now, port, &f).unwrap();
        assert!(t.via_plane, "frame {i} stayed on the DPU");
        assert_eq!(t.out, Ok((expected[i].0, &expected[i].1[..])), "frame {i}");
    }
    let (d, p) = (&pair.dpu, &pair.plane);
    // State continuity: the plane owns the connection and the DPU's copy of its conntrack
    // entry follows every TCP step.
    let now = Instant(start.0 + 10_000_000);
    let owner = p
        .pipeline()
        .export_conn(now, ACME, &key())
        .expect("the plane tracks it");
    let copy = d
        .pipeline()
        .export_conn(now, ACME, &key())
        .expect("the DPU has a copy");
    assert_eq!(copy.state, owner.state);
    assert!(d.counters().adopted >= 2, "{:?}", d.counters());
    assert_eq!(d.counters().orphan + p.counters().orphan, 0);
}

#[test]
fn a_frame_processed_in_place_leaves_as_a_copied_one_does_and_a_steered_one_untouched() {
    let (mut copied, mut in_place) = (dpu(), dpu());
    for (i, (port, f)) in handshake().into_iter().enumerate() {
        let now = at(1 + i as u64);
        let want = match copied.process(now, port, 0, &f) {
            Outcome::Forward {
                port,
                bytes,
                generated,
            } => (port, bytes.to_vec(), generated),
            other => panic!("frame {i}: {other:?}"),
        };
        let mut pkt = PacketBuf::from_frame(&f);
        match in_place.process_in_place(now, port, &mut pkt) {
            Outcome::Forward {
                port,
                bytes,
                generated,
            } => assert_eq!((port, bytes.to_vec(), generated), want, "frame {i}"),
            other => panic!("frame {i} in place: {other:?}"),
        }
        assert_eq!(
            pkt.data(),
            &want.1[..],
            "the caller's buffer holds the result"
        );
    }
    assert_eq!(copied.counters(), in_place.counters());

    // Steered to the plane: the frame leaves as it came, so the caller's buffer is unchanged.
    let (mut pair, now) = active_pair();
    let (port, f) = &handshake()[0];
    let mut pkt = PacketBuf::from_frame(f);
    assert!(matches!(
        pair.dpu.process_in_place(now, *port, &mut pkt),
        Outcome::Steer { .. }
    ));
    assert_eq!(pkt.data(), &f[..]);
}

#[test]
fn a_conntrack_change_follows_the_mirror_that_creates_the_copy() {
    let (pair, now) = active_pair();
    let (mut d, mut p) = (pair.dpu, pair.plane);
    let (port, syn) = handshake().remove(0);
    let msg = match d.process(now, port, 0, &syn) {
        Outcome::Steer { msg } => msg,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        p.process(now, port, msg, 0, &syn),
        Outcome::Return { .. }
    ));
    let out: Vec<Outgoing> = std::iter::from_fn(|| p.poll_transmit(now)).collect();
    let mirror = out
        .iter()
        .position(|o| {
            matches!(
                o,
                Outgoing::Msg {
                    msg: Msg::Sync {
                        kind: SyncKind::Mirror,
                        ..
                    },
                    snapshot: Some(_),
                    ..
                }
            )
        })
        .unwrap_or_else(|| panic!("no mirror with its snapshot: {out:?}"));
    let change = out
        .iter()
        .position(|o| matches!(o, Outgoing::Conntrack(_)))
        .unwrap_or_else(|| panic!("no conntrack change: {out:?}"));
    assert!(mirror < change, "{out:?}");
}

#[test]
fn a_copy_s_snapshot_never_replaces_the_owner_s() {
    let (mut pair, start) = active_pair();
    for (i, (port, f)) in handshake().into_iter().take(3).enumerate() {
        let now = Instant(start.0 + i as u64 * 1_000_000);
        pair.process(now, port, &f).unwrap();
    }
    let (d, p) = (&pair.dpu, &mut pair.plane);
    let now = Instant(start.0 + 5_000_000);
    let owner = p.pipeline().export_conn(now, ACME, &key()).unwrap();
    let adopted = p.counters().adopted;
    // The DPU, holding a copy, sends an update with an older snapshot: the plane, the owner,
    // keeps its own entry; the same snapshot as a bare conntrack change is refused too.
    let mut stale = owner;
    stale.state = d.pipeline().export_conn(now, ACME, &key()).unwrap().state;
    stale.packets = [1, 0];
    let state = p.plane().conn(p.conns().id_of(ACME, &key())).unwrap().state;
    p.handle_msg(
        now,
        Msg::Sync {
            colour: spillway_fabric::types::Colour(1),
            kind: SyncKind::Update,
            state,
        },
        Some(stale),
    );
    p.handle_conntrack(now, &stale);
    assert_eq!(p.counters().adopted, adopted);
    assert_eq!(p.pipeline().export_conn(now, ACME, &key()), Some(owner));
}

#[test]
fn records_without_packets_and_unknown_ports_are_dropped_and_counted() {
    let mut d = dpu();
    let (_, syn) = handshake().remove(0);
    assert_eq!(
        d.process_from_plane(at(1), WEB, Msg::Absorbing, 0, &syn),
        Outcome::Drop(FrameDrop::Protocol)
    );
    assert_eq!(
        d.process(at(1), PortId(99), 0, &syn),
        Outcome::Drop(FrameDrop::NoTenant)
    );
    assert_eq!(
        d.process(at(1), WEB2, 0, &syn[..20]),
        Outcome::Drop(FrameDrop::Parse)
    );
    let c = d.counters();
    assert_eq!((c.drop_protocol, c.drop_no_tenant, c.drop_parse), (1, 1, 1));
    let mut p = plane();
    assert_eq!(
        p.direct_refused(at(1)),
        Outcome::Drop(FrameDrop::Protocol),
        "no direct frame to refuse"
    );
}

#[test]
fn a_forwarding_dpu_allocates_nothing_per_frame_once_warm() {
    let mut d = dpu();
    let frames = handshake();
    for (i, (port, f)) in frames.iter().enumerate() {
        assert!(matches!(
            d.process(at(1 + i as u64), *port, 0, f),
            Outcome::Forward { .. }
        ));
    }
    let (port, data) = &frames[3];
    // Warm-up: the flow entries, the model's windows.
    for i in 0..1_000u64 {
        d.process(at(10 + i / 100), *port, 0, data);
        while d.poll_transmit(at(10)).is_some() {}
    }
    let before = spillway_testkit::allocations();
    let mut forwarded = 0;
    for i in 0..10_000u64 {
        if let Outcome::Forward { .. } = d.process(at(20 + i / 1000), *port, 0, data) {
            forwarded += 1;
        }
    }
    assert_eq!(spillway_testkit::allocations(), before);
    assert_eq!(forwarded, 10_000);
}

/// An echo request from WEB2 to WEB with identifier `id`.
fn ping(id: u16, seq: u16) -> Vec<u8> {
    FrameBuilder::new()
        .eth(WEB2_MAC, ACME_ROUTER)
        .ipv4(WEB2_IP, WEB_IP)
        .icmp_echo(id, seq, false)
        .payload(b"ping")
        .build()
}

/// Sends `frame` into the DPU, through the plane (which opens its connection there), and
/// loses the plane before its mirror reaches the DPU: the classifier knows the connection,
/// neither model does.
fn open_on_a_plane_that_dies(pair: &mut Pair, now: Instant, frame: &[u8]) {
    let msg = match pair.dpu.process(now, WEB2, 0, frame) {
        Outcome::Steer { msg } => msg,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        pair.plane.process(now, WEB2, msg, 0, frame),
        Outcome::Return { .. }
    ));
    pair.dpu
        .dpu_mut()
        .handle_plane_failed(now, "killed before its mirror left");
    while pair.dpu.poll_transmit(now).is_some() {}
    while pair.dpu.poll_command().is_some() {}
}

#[test]
fn a_datagram_nobody_holds_opens_again_rather_than_being_dropped_until_it_idles_out() {
    let (mut pair, start) = active_pair();
    let t = |ms: u64| Instant(start.0 + ms * 1_000_000);
    // With no plane: the DPU alone opens it again.
    open_on_a_plane_that_dies(&mut pair, t(1), &ping(7, 1));
    assert!(
        pair.dpu
            .dpu()
            .conn(pair.dpu.conns().id_of(ACME, &echo_key(7)))
            .is_none()
    );
    match pair.dpu.process(t(2), WEB2, 0, &ping(7, 2)) {
        Outcome::Forward { port, .. } => assert_eq!(port, WEB),
        other => panic!("the second echo request: {other:?}"),
    }
    // With a new plane that has no state either: it punts, and the DPU opens it.
    pair.plane = plane();
    let now = pair.activate(t(3)).expect("a new plane activates");
    open_on_a_plane_that_dies(&mut pair, now, &ping(8, 1));
    pair.plane = plane();
    let now = pair
        .activate(Instant(now.0 + 1_000_000))
        .expect("and another");
    let through = pair.process(now, WEB2, &ping(8, 2)).unwrap();
    assert!(through.via_plane);
    assert_eq!(through.out.map(|(p, _)| p), Ok(WEB));
    // A TCP segment of a connection nobody holds is not a new connection.
    let (port, syn) = handshake().remove(0);
    let mut d2 = Pair::new(dpu(), plane());
    let now = d2.activate(at(1)).unwrap();
    open_on_a_plane_that_dies(&mut d2, now, &syn);
    let (_, ack) = handshake().remove(2);
    assert_eq!(
        d2.dpu.process(Instant(now.0 + 1), port, 0, &ack),
        Outcome::Drop(FrameDrop::Fabric)
    );
}

fn echo_key(id: u16) -> FlowKey {
    FlowKey {
        src_ip: IpAddr16::from_v4(WEB2_IP.octets()),
        dst_ip: IpAddr16::from_v4(WEB_IP.octets()),
        src_port: id,
        dst_port: 0x0800,
        proto: ip_proto::ICMP,
    }
}

/// The plane's frame node over one shard ([`PlaneShardModel`], what a thread of a plane that
/// shards runs) serves a frame the DPU steered as the whole plane does: the same port, the
/// same bytes, the connection owned by the shard, the workers charged in the plane's one
/// budget.
#[test]
fn a_plane_shard_serves_a_steered_frame_as_the_whole_plane_does() {
    use spillway_fabric::dpu::Role;
    use spillway_fabric::frame::PlaneShardModel;
    use spillway_fabric::spill::{PlaneResources, PlaneShard, PlaneView};

    let (mut pair, start) = active_pair();
    let (port, syn) = handshake().swap_remove(0);
    let Outcome::Steer { msg } = pair.dpu.process(start, port, 0, &syn) else {
        panic!("an active DPU steers a new connection to the plane");
    };
    let Msg::Packets(t) = msg else {
        panic!("{msg:?}")
    };
    let whole = match pair.plane.process(start, port, msg, 0, &syn) {
        Outcome::Return { port, bytes, .. } => (port, bytes.to_vec()),
        o => panic!("the whole plane: {o:?}"),
    };

    let mut f = FabricParams::default();
    f.dpu.shards = 2;
    let shards = 2;
    let k = spillway_fabric::dpu::shard_of(t.conn, f.dpu.redirect_buckets, shards);
    let view = PlaneView {
        colour: pair.plane.plane().view().colour,
        active: true,
        releasing: false,
        vatc: false,
    };
    let model = PlaneShardModel::new(
        PlaneShard::new(&f, k as u16, shards),
        view,
        PlaneResources::new(&f, 1),
    );
    let mut sw = spillway_fabric::frame::PlaneSwitch::with_model(
        model,
        policy(),
        PipelineConfig::default(),
        CONNS_MAX,
    )
    .expect("valid config");
    match sw.process(start, port, msg, 0, &syn) {
        Outcome::Return { port, bytes, .. } => assert_eq!((port, bytes.to_vec()), whole),
        o => panic!("the shard: {o:?}"),
    }
    let shard = sw.plane().shard();
    assert_eq!(shard.conn(t.conn).map(|c| c.role), Some(Role::Owner));
    assert_eq!(shard.counters().processed, 1);
    assert_eq!(shard.counters().new_conn, 1);
    // Its mirror to the DPU, with the pipeline's conntrack snapshot attached.
    let out: Vec<Outgoing> = std::iter::from_fn(|| sw.poll_transmit(start)).collect();
    assert!(
        out.iter().any(|o| matches!(
            o,
            Outgoing::Msg {
                msg: Msg::Sync {
                    kind: SyncKind::Mirror,
                    ..
                },
                snapshot: Some(_),
                ..
            }
        )),
        "{out:?}"
    );
}

/// A DPU and a plane with every redirect bucket live, warm standby on or off, and the
/// connection of [`handshake`] open through the plane; with warm standby the DPU has asked for
/// a warm plane in slot 1.
fn open_pair(warm_standby: bool) -> (Pair, Instant) {
    let mut f = FabricParams::default();
    f.host.warm_standby = warm_standby;
    let dpu = DpuSwitch::new(&f, policy(), PipelineConfig::default(), CONNS_MAX).unwrap();
    let plane = PlaneSwitch::new(&f, policy(), PipelineConfig::default(), CONNS_MAX).unwrap();
    let mut pair = Pair::new(dpu, plane);
    let start = pair.activate(at(1)).expect("the plane activates");
    let mut now = start;
    for (i, (port, fr)) in handshake().into_iter().take(3).enumerate() {
        now = Instant(start.0 + i as u64 * 1_000_000);
        pair.process(now, port, &fr).unwrap();
    }
    (pair, now)
}

#[test]
fn the_warm_plane_s_bulk_sync_carries_the_dpu_s_snapshot_of_every_connection() {
    let (mut pair, now) = open_pair(true);
    let d = &mut pair.dpu;
    assert_eq!(d.dpu().active_slot(), PlaneSlot(0));
    // Nothing for a warm plane until one is up in the other slot.
    assert!(d.poll_warm_transmit(now).is_none());
    d.dpu_mut().handle_plane_up_in(now, PlaneSlot(1));
    let out: Vec<Outgoing> = std::iter::from_fn(|| d.poll_warm_transmit(now)).collect();
    let conn = d.conns().id_of(ACME, &key());
    let mine = d
        .pipeline()
        .export_conn(now, ACME, &key())
        .expect("the DPU's copy");
    let mirror = out.iter().find_map(|o| match o {
        Outgoing::Msg {
            msg:
                Msg::Sync {
                    kind: SyncKind::Mirror,
                    state,
                    ..
                },
            snapshot,
            ..
        } if state.conn == conn => Some(*snapshot),
        _ => None,
    });
    assert_eq!(mirror, Some(Some(mine)), "{out:?}");
    assert!(
        matches!(
            out.last(),
            Some(Outgoing::Msg {
                msg: Msg::SyncDone { .. },
                ..
            })
        ),
        "{out:?}"
    );
    // The active plane's queue got none of it.
    assert!(d.poll_transmit(now).is_none());
}

#[test]
fn a_fenced_plane_s_snapshot_never_replaces_the_dpu_s_copy() {
    let (mut pair, now) = open_pair(false);
    let d = &mut pair.dpu;
    // No warm standby: slot 1 holds no plane of the DPU's (a plane stopped there, say), so its
    // messages are fenced.
    assert_eq!(d.dpu().sender(PlaneSlot(1)), Sender::Fenced);
    let conn = d.conns().id_of(ACME, &key());
    let copy = d.dpu().conn(conn).copied().expect("the DPU's copy");
    assert_eq!(copy.role, Role::Copy);
    let before = d.pipeline().export_conn(now, ACME, &key()).unwrap();
    let adopted = d.counters().adopted;
    // A mirror claiming a newer state, with a snapshot from long ago.
    let mut stale = before;
    stale.packets = [1, 0];
    let mut state = copy.state;
    state.version += 10;
    let mirror = Msg::Sync {
        colour: spillway_fabric::types::Colour(1),
        kind: SyncKind::Mirror,
        state,
    };
    d.handle_msg_from(now, PlaneSlot(1), mirror, Some(stale));
    assert_eq!(d.counters().adopted, adopted);
    assert_eq!(d.pipeline().export_conn(now, ACME, &key()), Some(before));
    // The current plane still owns it: the newer state went on to it as an update.
    assert_eq!(d.dpu().conn(conn).unwrap().role, Role::Copy);
    let out: Vec<Outgoing> = std::iter::from_fn(|| d.poll_transmit(now)).collect();
    assert!(
        out.iter().any(|o| matches!(
            o,
            Outgoing::Msg {
                msg: Msg::Sync {
                    kind: SyncKind::Update,
                    ..
                },
                ..
            }
        )),
        "{out:?}"
    );
    // The same from the active plane is the owner's word and is adopted.
    d.handle_msg_from(now, PlaneSlot(0), mirror, Some(stale));
    assert_eq!(d.counters().adopted, adopted + 1);
}
