//! Generates the example captures in `examples/`, deterministically (fixed addresses, sequence
//! numbers and timestamps), from `spillway_wire::build`:
//!
//! - `varied.pcap`: one frame of each shape `spillway pcap inspect` must handle, valid and
//!   broken; `crates/cli/tests/inspect_vs_tshark.rs` compares our view of it with tshark's.
//! - `pipeline-in.pcap`: traffic for `examples/policy-basic.toml` through `spillway pcap run`;
//!   `crates/cli/tests/pcap_run.rs` asserts the verdict of every frame.
//!
//! Run: `cargo run -p spillway --example make_captures -- examples/`. The frame lists are
//! functions so the tests can include this file, regenerate the captures and refer to frames by
//! name; `tests/captures_fresh.rs` checks the committed files are byte-identical to fresh ones.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use spillway_wire::build::{FrameBuilder, Ipv6Ext, VxlanOuter, vxlan_encap};
use spillway_wire::tcp::flags::{ACK, FIN, PSH, SYN};
use spillway_wire::{MacAddr, Vni, checksum};

/// A named frame.
pub type Named = (&'static str, Vec<u8>);

/// Capture timestamps start here (2023-11-14) and advance 1 ms per frame.
const EPOCH_SECS: u64 = 1_700_000_000;

fn mac(last: [u8; 2]) -> MacAddr {
    MacAddr([0x02, 0, 0, 0x10, last[0], last[1]])
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().expect("a literal IPv6 address")
}

fn vni(v: u32) -> Vni {
    Vni::new(v).expect("a 24-bit VNI")
}

fn vxlan(inner: &[u8], src: IpAddr, dst: IpAddr, sport: u16, v: u32) -> Vec<u8> {
    vxlan_encap(
        inner,
        &VxlanOuter::new(mac([0xee, 1]), mac([0xee, 2]), src, dst, sport, vni(v)),
    )
}

/// Rewrites the IPv4 header checksum of the header at `at` (after a deliberate corruption, so
/// the frame is broken only in the way its name says).
fn fix_ipv4_checksum(f: &mut [u8], at: usize) {
    f[at + 10..at + 12].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(&f[at..at + 20]);
    f[at + 10..at + 12].copy_from_slice(&c.to_be_bytes());
}

/// Frames for `pcap inspect`: every shape the parser handles, then broken ones.
pub fn varied() -> Vec<Named> {
    let (a, b) = (mac([0, 1]), mac([0, 2]));
    let base = || FrameBuilder::new().eth(a, b);
    let h4 = |x| Ipv4Addr::new(192, 168, 1, x);
    let mut v: Vec<Named> = vec![
        (
            "ipv4_tcp",
            base()
                .ipv4(h4(1), h4(2))
                .tcp(40000, 80)
                .payload(b"GET / HTTP/1.0\r\n\r\n")
                .build(),
        ),
        (
            "ipv4_udp",
            base()
                .ipv4(h4(1), h4(11))
                .udp(30000, 30001)
                .payload(&[0xab; 12])
                .build(),
        ),
        (
            "ipv4_icmp_echo",
            base()
                .ipv4(h4(1), h4(2))
                .icmp_echo(0x1234, 1, false)
                .payload(b"ping")
                .build(),
        ),
        (
            "vlan_ipv4_tcp",
            base().vlan(100).ipv4(h4(3), h4(4)).tcp(40001, 443).build(),
        ),
        (
            "qinq_ipv4_udp",
            base()
                .vlan(200)
                .vlan(300)
                .ipv4(h4(5), h4(6))
                .udp(1000, 2000)
                .payload(b"qinq")
                .build(),
        ),
        (
            "ipv4_options_tcp",
            // Router Alert (RFC 2113) plus a NOP and EOL padding: 8 option bytes, IHL 7.
            base()
                .ipv4(h4(7), h4(8))
                .ipv4_options(&[0x94, 0x04, 0x00, 0x00, 0x01])
                .tcp(40002, 22)
                .build(),
        ),
        (
            "ipv4_first_fragment_udp",
            base()
                .ipv4(h4(9), h4(10))
                .ident(0x4242)
                .fragment(0, true)
                .udp(5000, 6000)
                .payload(&[1; 24])
                .build(),
        ),
        (
            "ipv4_nonfirst_fragment_udp",
            base()
                .ipv4(h4(9), h4(10))
                .ident(0x4242)
                .fragment(4, false)
                .raw(17)
                .payload(&[2; 16])
                .build(),
        ),
        (
            "ipv6_ext_chain_tcp",
            base()
                .ipv6(v6("2001:db8::1"), v6("2001:db8::2"))
                .ipv6_ext(Ipv6Ext::HopByHop(vec![0x01, 0x02, 0x00, 0x00])) // PadN
                .ipv6_ext(Ipv6Ext::Routing {
                    routing_type: 4,
                    segments_left: 0,
                    data: srh_segment("2001:db8::2"),
                })
                .ipv6_ext(Ipv6Ext::Fragment {
                    offset: 0,
                    more: false,
                    ident: 7,
                }) // atomic (RFC 6946)
                .ipv6_ext(Ipv6Ext::DestOpts(vec![0x01, 0x02, 0x00, 0x00]))
                .tcp(40003, 8080)
                .payload(b"v6")
                .build(),
        ),
        (
            "ipv6_nonfirst_fragment_udp",
            base()
                .ipv6(v6("2001:db8::3"), v6("2001:db8::4"))
                .ipv6_ext(Ipv6Ext::Fragment {
                    offset: 10,
                    more: false,
                    ident: 8,
                })
                .raw(17)
                .payload(&[3; 16])
                .build(),
        ),
        (
            "icmpv6_echo",
            base()
                .ipv6(v6("2001:db8::5"), v6("2001:db8::6"))
                .icmp_echo(0x77, 2, false)
                .build(),
        ),
        (
            "vxlan_v4_inner_ipv4_tcp",
            vxlan(
                &FrameBuilder::new()
                    .ipv4([10, 1, 0, 10], [10, 2, 0, 5])
                    .tcp(22, 50000)
                    .build(),
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
                49200,
                1001,
            ),
        ),
        (
            "vxlan_v4_inner_ipv6_udp",
            vxlan(
                &FrameBuilder::new()
                    .ipv6(v6("fd00:1::10"), v6("fd00:2::20"))
                    .udp(4000, 5000)
                    .build(),
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
                49201,
                1002,
            ),
        ),
        (
            "vxlan_v6_underlay_inner_ipv4_tcp",
            vxlan(
                &FrameBuilder::new()
                    .ipv4([10, 3, 0, 1], [10, 3, 0, 2])
                    .tcp(1234, 5678)
                    .build(),
                IpAddr::V6(v6("2001:db8:f::1")),
                IpAddr::V6(v6("2001:db8:f::2")),
                49202,
                7,
            ),
        ),
        (
            "arp_request",
            base()
                .eth(a, MacAddr::BROADCAST)
                .arp(1, [192, 168, 1, 1], MacAddr::ZERO, [192, 168, 1, 2])
                .build(),
        ),
        (
            "arp_reply",
            FrameBuilder::new()
                .eth(b, a)
                .arp(2, [192, 168, 1, 2], a, [192, 168, 1, 1])
                .build(),
        ),
    ];

    // Broken frames, each broken in exactly one way.
    let tcp = base()
        .ipv4(h4(1), h4(2))
        .tcp(40000, 80)
        .payload(b"data")
        .build();
    v.push(("broken_truncated_ethernet", tcp[..10].to_vec()));
    let mut f = tcp.clone();
    f[14] = 0x44; // IHL 4
    fix_ipv4_checksum(&mut f, 14);
    v.push(("broken_ipv4_ihl_lt_5", f));
    let mut f = tcp.clone();
    let total = u16::from_be_bytes([f[16], f[17]]) + 100;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ipv4_checksum(&mut f, 14);
    v.push(("broken_ipv4_total_length_beyond_frame", f));
    let mut f = tcp.clone();
    f[14 + 20 + 12] = 0x40; // data offset 4
    v.push(("broken_tcp_data_offset_lt_5", f));
    let f6 = base()
        .ipv6(v6("2001:db8::1"), v6("2001:db8::2"))
        .udp(1, 2)
        .build();
    v.push(("broken_truncated_ipv6", f6[..14 + 20].to_vec()));
    v.push((
        "broken_vxlan_truncated_inner",
        vxlan(
            &[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0], // 10 bytes: not even an Ethernet header
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
            49203,
            1001,
        ),
    ));
    let mut f = base()
        .ipv4(h4(1), h4(11))
        .udp(30000, 30001)
        .payload(&[0xcd; 8])
        .build();
    let udp_len = u16::from_be_bytes([f[38], f[39]]) + 50;
    f[38..40].copy_from_slice(&udp_len.to_be_bytes());
    v.push(("broken_udp_length_beyond_frame", f));
    v
}

/// Type-specific data of a segment routing header (RFC 8754 section 2) with one segment: Last
/// Entry 0, Flags 0, Tag 0, then the segment.
fn srh_segment(seg: &str) -> Vec<u8> {
    let mut d = vec![0, 0, 0, 0];
    d.extend_from_slice(&v6(seg).octets());
    d
}

// Addresses from examples/policy-basic.toml.
const WEB_MAC: MacAddr = MacAddr([0x02, 0, 0, 0x01, 0, 0x0a]);
const DB_MAC: MacAddr = MacAddr([0x02, 0, 0, 0x01, 0, 0x0c]);
const ACME_ROUTER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0x01, 0x01]);
const UPLINK_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
const GATEWAY_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xfe]);
const WEB_IP: [u8; 4] = [10, 1, 0, 10];
const DB_IP: [u8; 4] = [10, 1, 1, 20];
const REMOTE_IP: [u8; 4] = [93, 184, 216, 34];
const ACME_PUBLIC_IP: [u8; 4] = [203, 0, 113, 10];
/// The first port of acme's SNAT pool (`port_min`): the pool allocates upward from it, and the
/// web VM's internet connection is the first SNAT binding in the capture.
pub const ACME_SNAT_PORT: u16 = 1024;

/// Frames for `pcap run` with `examples/policy-basic.toml`, in capture order. The test
/// `tests/pcap_run.rs` states the expected verdict of each by name.
pub fn pipeline_in() -> Vec<Named> {
    let from_web = || FrameBuilder::new().eth(WEB_MAC, ACME_ROUTER_MAC);
    let from_db = || FrameBuilder::new().eth(DB_MAC, ACME_ROUTER_MAC);
    let from_gw = || FrameBuilder::new().eth(GATEWAY_MAC, UPLINK_MAC);
    let tcp =
        |b: FrameBuilder, sp, dp, flags, seq, ack| b.tcp(sp, dp).tcp_flags(flags).seq(seq).ack(ack);
    let (ws, ds) = (1000u32, 5000u32); // initial sequence numbers web -> db, db -> web
    let w2d = |f, s, a| tcp(from_web().ipv4(WEB_IP, DB_IP), 40000, 5432, f, s, a);
    let d2w = |f, s, a| tcp(from_db().ipv4(DB_IP, WEB_IP), 5432, 40000, f, s, a);
    let query = b"SELECT 1;";
    let mut v: Vec<Named> = vec![
        // A complete TCP connection web (port 10) <-> db (port 12), routed locally.
        ("db_syn", w2d(SYN, ws, 0).build()),
        ("db_syn_ack", d2w(SYN | ACK, ds, ws + 1).build()),
        ("db_ack", w2d(ACK, ws + 1, ds + 1).build()),
        (
            "db_data",
            w2d(PSH | ACK, ws + 1, ds + 1).payload(query).build(),
        ),
        (
            "db_fin",
            w2d(FIN | ACK, ws + 1 + query.len() as u32, ds + 1).build(),
        ),
        (
            "db_fin_ack",
            d2w(FIN | ACK, ds + 1, ws + 2 + query.len() as u32).build(),
        ),
        (
            "db_last_ack",
            w2d(ACK, ws + 2 + query.len() as u32, ds + 2).build(),
        ),
        // The web VM reaches the internet through SNAT; the reply comes back on the uplink to
        // the public address and the allocated port.
        (
            "inet_syn",
            tcp(from_web().ipv4(WEB_IP, REMOTE_IP), 40001, 80, SYN, 7000, 0).build(),
        ),
        (
            "inet_syn_ack",
            tcp(
                from_gw().ipv4(REMOTE_IP, ACME_PUBLIC_IP),
                80,
                ACME_SNAT_PORT,
                SYN | ACK,
                9000,
                7001,
            )
            .build(),
        ),
        (
            "inet_ack",
            tcp(
                from_web().ipv4(WEB_IP, REMOTE_IP),
                40001,
                80,
                ACK,
                7001,
                9001,
            )
            .build(),
        ),
    ];
    // acme's other segment (10.2.0.0/16 behind VTEP 192.0.2.2) opens SSH to the web VM; the
    // VM's reply must leave VXLAN-encapsulated toward 192.0.2.2.
    let inner = tcp(
        FrameBuilder::new()
            .eth(mac([0xaa, 5]), ACME_ROUTER_MAC)
            .ipv4([10, 2, 0, 5], WEB_IP),
        50000,
        22,
        SYN,
        300,
        0,
    );
    let uplink_vxlan = |inner: &[u8], v| {
        let mut outer = VxlanOuter::new(
            GATEWAY_MAC,
            UPLINK_MAC,
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            54321,
            vni(v),
        );
        outer.ttl = 63;
        vxlan_encap(inner, &outer)
    };
    v.push(("vxlan_in_syn", uplink_vxlan(&inner.build(), 1001)));
    v.push((
        "vxlan_reply_syn_ack",
        tcp(
            from_web().ipv4(WEB_IP, [10, 2, 0, 5]),
            22,
            50000,
            SYN | ACK,
            800,
            301,
        )
        .build(),
    ));
    // Drops, one per reason.
    v.push((
        "drop_spoofed_ip",
        from_web()
            .ipv4([10, 1, 0, 99], DB_IP)
            .tcp(40002, 5432)
            .tcp_flags(SYN)
            .build(),
    ));
    v.push((
        "drop_sg_deny",
        from_db()
            .ipv4(DB_IP, [8, 8, 8, 8])
            .udp(40003, 53)
            .payload(&[0; 12])
            .build(),
    ));
    v.push((
        "drop_blackhole",
        from_web()
            .ipv4(WEB_IP, [10, 1, 255, 5])
            .tcp(40004, 80)
            .tcp_flags(SYN)
            .build(),
    ));
    v.push((
        "drop_unknown_vni",
        uplink_vxlan(&inner.clone().seq(400).build(), 4242),
    ));
    v.push((
        "arp_gateway",
        from_web()
            .eth(WEB_MAC, MacAddr::BROADCAST)
            .arp(1, WEB_IP, MacAddr::ZERO, [10, 1, 0, 1])
            .build(),
    ));
    let mut f = from_web()
        .ipv4(WEB_IP, DB_IP)
        .tcp(40005, 5432)
        .tcp_flags(SYN)
        .build();
    f[14] = 0x43; // IHL 3
    fix_ipv4_checksum(&mut f, 14);
    v.push(("drop_malformed", f));
    v
}

/// The 1 ms-spaced timestamp of frame `i`.
pub fn timestamp(i: usize) -> Duration {
    Duration::from_secs(EPOCH_SECS) + Duration::from_millis(i as u64)
}

/// The bytes of a classic little-endian microsecond pcap holding `frames`.
pub fn pcap_bytes(frames: &[Named]) -> Vec<u8> {
    let header = PcapHeader {
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(Vec::new(), header).expect("writing to memory");
    for (i, (_, data)) in frames.iter().enumerate() {
        let len = u32::try_from(data.len()).expect("small frames");
        w.write_packet(&PcapPacket::new(timestamp(i), len, data))
            .expect("writing to memory");
    }
    w.into_writer()
}

/// The files this generator writes, by name.
pub fn captures() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("varied.pcap", pcap_bytes(&varied())),
        ("pipeline-in.pcap", pcap_bytes(&pipeline_in())),
    ]
}

/// Writes every capture into `dir`.
pub fn write_all(dir: &Path) -> std::io::Result<()> {
    for (name, bytes) in captures() {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "examples".to_string());
    if let Err(e) = write_all(Path::new(&dir)) {
        eprintln!("make_captures: writing into {dir}: {e}");
        std::process::exit(1);
    }
    for (name, frames) in [
        ("varied.pcap", varied()),
        ("pipeline-in.pcap", pipeline_in()),
    ] {
        println!("{dir}/{name}: {} frames", frames.len());
    }
}
