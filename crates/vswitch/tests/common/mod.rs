//! Shared helpers for the pipeline tests: the example policy, its addresses, and frame builders.
#![allow(dead_code)]

pub mod sequence;

use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};
use spillway_wire::build::{FrameBuilder, VxlanOuter, vxlan_encap};
use spillway_wire::{MacAddr, Vni};
use std::net::{IpAddr, Ipv4Addr};

pub const UPLINK: PortId = PortId(0);
pub const WEB: PortId = PortId(10);
pub const WEB2: PortId = PortId(11);
pub const DB: PortId = PortId(12);
pub const GLOBEX: PortId = PortId(20);

pub const UPLINK_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
pub const GATEWAY_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xfe]);
pub const ACME_ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 1, 1]);
pub const GLOBEX_ROUTER: MacAddr = MacAddr([2, 0, 0, 0, 2, 1]);
pub const WEB_MAC: MacAddr = MacAddr([2, 0, 0, 1, 0, 0x0a]);
pub const WEB2_MAC: MacAddr = MacAddr([2, 0, 0, 1, 0, 0x0b]);
pub const DB_MAC: MacAddr = MacAddr([2, 0, 0, 1, 0, 0x0c]);
pub const GLOBEX_MAC: MacAddr = MacAddr([2, 0, 0, 2, 0, 0x0a]);

pub const WEB_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 10);
pub const WEB2_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 11);
pub const DB_IP: Ipv4Addr = Ipv4Addr::new(10, 1, 1, 20);
pub const VTEP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const REMOTE_VTEP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
pub const REMOTE_VM: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 5);
pub const ACME_PUBLIC: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
pub const INTERNET_HOST: Ipv4Addr = Ipv4Addr::new(93, 184, 216, 34);
pub const ACME_VNI: u32 = 1001;

pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const FIN: u8 = 0x01;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;

/// The text of the example policy shipped in `examples/policy-basic.toml` (included, so that
/// the fuzz targets sharing these helpers need no file at run time).
pub const EXAMPLE_POLICY: &str = include_str!("../../../../examples/policy-basic.toml");

/// The example policy shipped in `examples/policy-basic.toml`.
pub fn example_policy() -> Policy {
    Policy::from_toml_str(EXAMPLE_POLICY, "examples/policy-basic.toml")
        .expect("the example policy loads")
}

pub fn pipeline(cfg: PipelineConfig) -> Pipeline {
    Pipeline::new(example_policy(), cfg).expect("valid pipeline config")
}

/// A TCP segment between two IPv4 endpoints.
pub fn tcp(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    FrameBuilder::new()
        .eth(src_mac, dst_mac)
        .ipv4(src.0, dst.0)
        .tcp(src.1, dst.1)
        .tcp_flags(flags)
        .seq(1000)
        .ack(if flags & ACK != 0 { 2000 } else { 0 })
        .payload(payload)
        .build()
}

/// A TCP segment without payload from `src_mac` to acme's router MAC: what a VM sends, and the
/// inner frame of overlay traffic (whose inner MACs the receiving vSwitch rewrites).
pub fn to_acme(src_mac: MacAddr, src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8) -> Vec<u8> {
    tcp(src_mac, ACME_ROUTER, src, dst, flags, b"")
}

/// A UDP datagram between two IPv4 endpoints.
pub fn udp(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    payload: &[u8],
) -> Vec<u8> {
    FrameBuilder::new()
        .eth(src_mac, dst_mac)
        .ipv4(src.0, dst.0)
        .udp(src.1, dst.1)
        .payload(payload)
        .build()
}

/// An ICMP echo request or reply.
pub fn ping(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    reply: bool,
) -> Vec<u8> {
    FrameBuilder::new()
        .eth(src_mac, dst_mac)
        .ipv4(src, dst)
        .icmp_echo(id, 1, reply)
        .payload(b"ping")
        .build()
}

/// `inner` VXLAN-encapsulated from `from_vtep` to `to_vtep` as it arrives on the uplink.
pub fn vxlan(inner: &[u8], from_vtep: Ipv4Addr, to_vtep: Ipv4Addr, vni: u32) -> Vec<u8> {
    let outer = VxlanOuter::new(
        GATEWAY_MAC,
        UPLINK_MAC,
        IpAddr::V4(from_vtep),
        IpAddr::V4(to_vtep),
        50000,
        Vni::new(vni).expect("24-bit VNI"),
    );
    vxlan_encap(inner, &outer)
}

/// Run one frame through the pipeline; returns the verdict, the output bytes and whether it was
/// a fast-path hit.
pub fn run(
    p: &mut Pipeline,
    now: Instant,
    ingress: PortId,
    frame: &[u8],
) -> (Verdict, Vec<u8>, bool) {
    let hits = p.counters().fast_path_hits;
    let mut buf = PacketBuf::from_frame(frame);
    let v = p.process(now, ingress, &mut buf);
    p.check_invariants()
        .expect("pipeline invariants hold after every packet");
    (v, buf.data().to_vec(), p.counters().fast_path_hits > hits)
}

/// `frame` (untagged IPv4 or IPv6, or the same at `l3`) as the tenant router forwards it: TTL /
/// hop limit one less, the IPv4 header checksum recomputed; every other byte as it was.
pub fn routed_at(frame: &[u8], l3: usize) -> Vec<u8> {
    let mut f = frame.to_vec();
    if f[l3] >> 4 == 4 {
        f[l3 + 8] -= 1;
        f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
        let ihl = usize::from(f[l3] & 0x0f) * 4;
        let c = spillway_wire::checksum::ipv4_header_checksum(&f[l3..l3 + ihl]);
        f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    } else {
        f[l3 + 7] -= 1;
    }
    f
}

/// [`routed_at`] for an untagged frame.
pub fn routed(frame: &[u8]) -> Vec<u8> {
    routed_at(frame, 14)
}

pub fn secs(s: u64) -> Instant {
    Instant(s * 1_000_000_000)
}

/// Cuts an Ethernet + IPv4 (no options) frame, IPv4 header at `l3`, into fragments of at most
/// `chunk` data bytes (a multiple of 8) with identification `id`: each gets its own total
/// length, flags, offset and header checksum, as a sender's IP layer would.
pub fn ipv4_fragments(frame: &[u8], l3: usize, chunk: usize, id: u16) -> Vec<Vec<u8>> {
    assert_eq!(chunk % 8, 0, "fragment data is a multiple of 8 bytes");
    let (head, data) = (&frame[..l3 + 20], &frame[l3 + 20..]);
    data.chunks(chunk)
        .enumerate()
        .map(|(i, part)| {
            let mut f = head.to_vec();
            f[l3 + 2..l3 + 4].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
            f[l3 + 4..l3 + 6].copy_from_slice(&id.to_be_bytes());
            let more = (i + 1) * chunk < data.len();
            let fo = ((i * chunk / 8) as u16) | if more { 0x2000 } else { 0 };
            f[l3 + 6..l3 + 8].copy_from_slice(&fo.to_be_bytes());
            f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
            let c = spillway_wire::checksum::checksum(&f[l3..l3 + 20]);
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            f.extend_from_slice(part);
            f
        })
        .collect()
}
