//! Proves that `spillway pcap inspect` agrees with tshark, an independent dissector, on the
//! shapes where parsers usually disagree: IPv4 first, middle and last fragments of real
//! (length-inconsistent) datagrams, IPv6 fragments behind hop-by-hop, routing and
//! destination-options headers (and an atomic fragment), 802.1Q, QinQ and 0x9100 stacks, VXLAN
//! to 4789 carrying tagged, fragmented and IPv6 inner frames, and truncations at each layer
//! (Ethernet, tag, IPv4 and IPv6 headers, an extension header, TCP, UDP, VXLAN, the inner
//! Ethernet and IP headers, a first fragment's UDP header). The frames are built here, written
//! to a pcap in a temp dir, and both `spillway pcap inspect` (JSON lines) and `tshark -T fields`
//! read it; per frame we compare malformed-or-not, VNI, VLAN ids (outer then inner), addresses,
//! protocol, ports (only where tshark dissects a TCP/UDP header), and the fragment id, byte
//! offset and more-fragments flag. The rules that reduce tshark's view to ours, and the one
//! place where the two are compared differently (fragmented VXLAN), are in `README.md` beside
//! this file. Without tshark the test prints a skip message, unless `CI=true`, where it fails.

#[allow(dead_code)]
#[path = "../examples/make_captures.rs"]
mod make_captures;

#[allow(dead_code)]
mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use common::{last, occurrences as occ, tshark_available};
use serde_json::Value;
use spillway_wire::build::{FrameBuilder, Ipv6Ext, VxlanOuter, vxlan_encap};
use spillway_wire::{MacAddr, ParseOptions, Vni, checksum, parse_frame};

const FIELDS: [&str; 27] = [
    "frame.number",
    "frame.protocols",
    "ip.src",
    "ip.dst",
    "ip.proto",
    "ipv6.src",
    "ipv6.dst",
    "ipv6.nxt",
    "ipv6.hopopts.nxt",
    "ipv6.routing.nxt",
    "ipv6.fraghdr.nxt",
    "ipv6.dstopts.nxt",
    "tcp.srcport",
    "tcp.dstport",
    "udp.srcport",
    "udp.dstport",
    "vxlan.vni",
    "_ws.malformed",
    "_ws.expert.severity",
    "vlan.id",
    "ip.id",
    "ip.frag_offset",
    "ip.flags.mf",
    "ipv6.fraghdr.ident",
    "ipv6.fraghdr.offset",
    "ipv6.fraghdr.more",
    "ieee8021ad.id",
];

/// Wireshark's expert severity "Error" (`PI_ERROR`): structural faults it still partly decodes.
const PI_ERROR: &str = "8388608";

/// IPv6 extension headers tshark walks.
const IPV6_EXT: [u8; 4] = [0, 43, 44, 60];

const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

fn v4(a: u8, b: u8) -> (Ipv4Addr, Ipv4Addr) {
    (Ipv4Addr::new(10, 0, a, 1), Ipv4Addr::new(10, 0, b, 2))
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().expect("a literal address")
}

fn fix_ipv4(f: &mut [u8], l3: usize) {
    f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(&f[l3..l3 + 20]);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// Cuts an IPv4 frame (header at `l3`, no options) into fragments of `chunk` data bytes.
fn v4_fragments(frame: &[u8], l3: usize, chunk: usize) -> Vec<Vec<u8>> {
    let (head, data) = (&frame[..l3 + 20], &frame[l3 + 20..]);
    data.chunks(chunk)
        .enumerate()
        .map(|(i, part)| {
            let mut f = head.to_vec();
            f[l3 + 2..l3 + 4].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
            let more = (i + 1) * chunk < data.len();
            let fo = ((i * chunk / 8) as u16) | if more { 0x2000 } else { 0 };
            f[l3 + 6..l3 + 8].copy_from_slice(&fo.to_be_bytes());
            fix_ipv4(&mut f, l3);
            f.extend_from_slice(part);
            f
        })
        .collect()
}

/// Cuts an IPv4 frame to `n` bytes and makes the IPv4 total length say so: the fault is then
/// inside the layer the cut lands in, not an IP length mismatch.
fn cut_v4(frame: &[u8], l3: usize, n: usize) -> Vec<u8> {
    let mut f = frame[..n].to_vec();
    f[l3 + 2..l3 + 4].copy_from_slice(&((n - l3) as u16).to_be_bytes());
    fix_ipv4(&mut f, l3);
    f
}

/// Cuts an IPv6 frame (header at 14) to `n` bytes with a matching payload length.
fn cut_v6(frame: &[u8], n: usize) -> Vec<u8> {
    let mut f = frame[..n].to_vec();
    f[18..20].copy_from_slice(&((n - 54) as u16).to_be_bytes());
    f
}

/// Sets the UDP length of the (only or inner) UDP header to `len`.
fn set_udp_len(mut f: Vec<u8>, len: u16) -> Vec<u8> {
    let p = parse_frame(&f, &ParseOptions::default()).expect("a valid frame to patch");
    let l4 = usize::from(p.innermost().l4_offset);
    f[l4 + 4..l4 + 6].copy_from_slice(&len.to_be_bytes());
    f
}

fn vx(inner: &[u8], v: u32) -> Vec<u8> {
    let outer = VxlanOuter::new(
        A,
        B,
        Ipv4Addr::new(192, 0, 2, 1).into(),
        Ipv4Addr::new(192, 0, 2, 2).into(),
        49152,
        Vni::new(v).expect("24-bit"),
    );
    vxlan_encap(inner, &outer)
}

fn frames() -> Vec<(&'static str, Vec<u8>)> {
    let base = || FrameBuilder::new().eth(A, B);
    let (s, d) = v4(1, 2);
    let big_udp = base()
        .ipv4(s, d)
        .ident(0x1234)
        .udp(5353, 53)
        .payload(&[7; 3000])
        .build();
    let udp_frags = v4_fragments(&big_udp, 14, 1480);
    let big_tcp = base()
        .vlan(100)
        .ipv4(s, d)
        .ident(0xbeef)
        .tcp(40000, 443)
        .payload(&[8; 2000])
        .build();
    let tcp_frags = v4_fragments(&big_tcp, 18, 1000);
    let big_ping = base()
        .ipv4(s, d)
        .ident(9)
        .icmp_echo(77, 1, false)
        .payload(&[9; 1600])
        .build();
    let ping_frags = v4_fragments(&big_ping, 14, 1480);
    let chain = |more: bool, offset: u16| {
        base()
            .ipv6(v6("2001:db8::1"), v6("2001:db8::2"))
            .ipv6_ext(Ipv6Ext::HopByHop(vec![1, 2, 0, 0]))
            .ipv6_ext(Ipv6Ext::Routing {
                routing_type: 0,
                segments_left: 0,
                data: vec![0; 4],
            })
            .ipv6_ext(Ipv6Ext::DestOpts(vec![1, 2, 0, 0]))
            .ipv6_ext(Ipv6Ext::Fragment {
                offset,
                more,
                ident: 0xabcd_ef01,
            })
    };
    let v6_first = set_udp_len(chain(true, 0).udp(5353, 53).payload(&[1; 64]).build(), 3000);
    let v6_middle = chain(true, 9).raw(17).payload(&[2; 64]).build();
    let v6_last = chain(false, 18).raw(17).payload(&[3; 64]).build();
    let v6_frag_then_dstopts = base()
        .ipv6(v6("2001:db8::3"), v6("2001:db8::4"))
        .ipv6_ext(Ipv6Ext::Fragment {
            offset: 0,
            more: true,
            ident: 5,
        })
        .ipv6_ext(Ipv6Ext::DestOpts(vec![1, 2, 0, 0]))
        .tcp(1, 2)
        .payload(&[4; 16])
        .build();
    let v6_atomic = base()
        .ipv6(v6("2001:db8::5"), v6("2001:db8::6"))
        .ipv6_ext(Ipv6Ext::Fragment {
            offset: 0,
            more: false,
            ident: 6,
        })
        .udp(1000, 2000)
        .payload(b"atomic")
        .build();
    let tagged = |tags: &[(u16, u16)]| {
        let mut b = base();
        for (tpid, tci) in tags {
            b = b.vlan_tpid(*tpid, *tci);
        }
        b.ipv4(s, d).udp(1, 2).payload(b"tags").build()
    };
    let inner_udp = FrameBuilder::new()
        .eth(A, B)
        .ipv4(Ipv4Addr::new(172, 16, 0, 1), Ipv4Addr::new(172, 16, 0, 2))
        .udp(3000, 4000)
        .payload(b"inner")
        .build();
    let inner_tagged = FrameBuilder::new()
        .eth(A, B)
        .vlan(300)
        .ipv4(Ipv4Addr::new(172, 16, 0, 3), Ipv4Addr::new(172, 16, 0, 4))
        .tcp(3001, 80)
        .build();
    let inner_big = FrameBuilder::new()
        .eth(A, B)
        .ipv4(Ipv4Addr::new(172, 16, 0, 5), Ipv4Addr::new(172, 16, 0, 6))
        .ident(0x77)
        .udp(3002, 4002)
        .payload(&[5; 1200])
        .build();
    let inner_frags = v4_fragments(&inner_big, 14, 800);
    let inner_v6 = FrameBuilder::new()
        .eth(A, B)
        .ipv6(v6("fd00::1"), v6("fd00::2"))
        .ipv6_ext(Ipv6Ext::Fragment {
            offset: 0,
            more: true,
            ident: 0x99,
        })
        .udp(3003, 4003)
        .payload(&[6; 40])
        .build();
    let inner_v6 = set_udp_len(vx(&inner_v6, 12), 900);
    let plain_tcp = base().ipv4(s, d).tcp(1234, 80).payload(b"x").build();
    let plain_udp = base().ipv4(s, d).udp(1234, 53).payload(b"q").build();
    let plain_v6 = base()
        .ipv6(v6("2001:db8::7"), v6("2001:db8::8"))
        .ipv6_ext(Ipv6Ext::HopByHop(vec![1, 2, 0, 0]))
        .tcp(1, 2)
        .build();
    vec![
        ("ipv4_udp_first_fragment", udp_frags[0].clone()),
        ("ipv4_udp_middle_fragment", udp_frags[1].clone()),
        ("ipv4_udp_last_fragment", udp_frags[2].clone()),
        ("vlan_ipv4_tcp_first_fragment", tcp_frags[0].clone()),
        ("vlan_ipv4_tcp_last_fragment", tcp_frags[1].clone()),
        ("ipv4_icmp_first_fragment", ping_frags[0].clone()),
        ("ipv4_icmp_last_fragment", ping_frags[1].clone()),
        ("ipv6_hbh_rt_dst_frag_udp_first", v6_first),
        ("ipv6_hbh_rt_dst_frag_middle", v6_middle),
        ("ipv6_hbh_rt_dst_frag_last", v6_last),
        ("ipv6_frag_then_dstopts_tcp_first", v6_frag_then_dstopts),
        ("ipv6_atomic_fragment_udp", v6_atomic),
        ("vlan_8100", tagged(&[(0x8100, 42)])),
        (
            "qinq_88a8_8100",
            tagged(&[(0x88a8, 0x2010), (0x8100, 0xe020)]),
        ),
        ("qinq_9100_8100", tagged(&[(0x9100, 7), (0x8100, 4094)])),
        ("vxlan_udp", vx(&inner_udp, 4096)),
        ("vxlan_inner_vlan_tcp", vx(&inner_tagged, 1)),
        ("vxlan_inner_first_fragment", vx(&inner_frags[0], 0xabcdef)),
        ("vxlan_inner_last_fragment", vx(&inner_frags[1], 0xabcdef)),
        ("vxlan_inner_ipv6_first_fragment", inner_v6),
        (
            "vxlan_outer_first_fragment",
            v4_fragments(&vx(&inner_big, 5), 14, 1000)[0].clone(),
        ),
        ("trunc_ethernet", plain_tcp[..10].to_vec()),
        ("trunc_vlan_tag", tagged(&[(0x8100, 42)])[..16].to_vec()),
        ("trunc_ipv4_header", plain_tcp[..26].to_vec()),
        (
            "trunc_ipv4_total_length",
            plain_tcp[..plain_tcp.len() - 1].to_vec(),
        ),
        ("trunc_ipv6_header", plain_v6[..40].to_vec()),
        ("trunc_ipv6_ext_header", cut_v6(&plain_v6, 58)),
        ("trunc_tcp_header", cut_v4(&plain_tcp, 14, 44)),
        ("trunc_udp_header", cut_v4(&plain_udp, 14, 38)),
        (
            "trunc_first_fragment_udp_header",
            cut_v4(&udp_frags[0], 14, 38),
        ),
        ("trunc_vxlan_header", cut_v4(&vx(&inner_udp, 3), 14, 46)),
        ("trunc_vxlan_inner_ethernet", vx(&inner_udp[..10], 3)),
        ("trunc_vxlan_inner_ipv4", vx(&inner_udp[..24], 3)),
    ]
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).expect("a hex number"),
        None => match s {
            "True" => 1,
            "False" => 0,
            _ => s.parse().expect("a number"),
        },
    }
}

#[derive(Debug, PartialEq, Eq)]
struct View {
    broken: bool,
    vni: Option<u64>,
    vlans: Vec<u64>,
    src_ip: Option<String>,
    dst_ip: Option<String>,
    proto: Option<u64>,
    ports: (u64, u64),
    frag: Option<(u64, u64, bool)>,
}

const EMPTY: View = View {
    broken: true,
    vni: None,
    vlans: Vec::new(),
    src_ip: None,
    dst_ip: None,
    proto: None,
    ports: (0, 0),
    frag: None,
};

/// tshark's line reduced to the innermost IP layer, as `inspect` reports (rules in README.md).
fn theirs(c: &[&str]) -> View {
    let protos: Vec<&str> = c[1].split(':').collect();
    let mut v = View {
        broken: !c[17].is_empty() || occ(c[18]).contains(&PI_ERROR),
        vni: last(c[16]).map(num),
        // 802.1ad (0x88a8) tags are `ieee8021ad.id`, the others `vlan.id`; in every frame here
        // an 802.1ad tag is the outermost, so it goes first.
        vlans: occ(c[26]).into_iter().chain(occ(c[19])).map(num).collect(),
        ..EMPTY
    };
    let Some(at) = protos.iter().rposition(|p| *p == "ip" || *p == "ipv6") else {
        return v;
    };
    if protos[at] == "ip" {
        v.src_ip = last(c[2]).map(str::to_string);
        v.dst_ip = last(c[3]).map(str::to_string);
        v.proto = last(c[4]).map(num);
        // `ip.frag_offset`, like `ipv6.fraghdr.offset`, counts 8-octet units; `inspect` bytes.
        let (off, mf) = (last(c[21]).map_or(0, num), last(c[22]).map_or(0, num));
        if off != 0 || mf != 0 {
            v.frag = Some((last(c[20]).map_or(0, num), off * 8, mf != 0));
        }
    } else {
        assert_eq!(protos.iter().filter(|p| **p == "ipv6").count(), 1);
        v.src_ip = last(c[5]).map(str::to_string);
        v.dst_ip = last(c[6]).map(str::to_string);
        v.proto = c[7..=11]
            .iter()
            .flat_map(|f| occ(f))
            .map(num)
            .find(|p| !IPV6_EXT.contains(&(*p as u8)));
        if let Some(id) = last(c[23]) {
            let units = last(c[24]).map_or(0, num);
            v.frag = Some((num(id), units * 8, last(c[25]).map_or(0, num) != 0));
        }
    }
    let port = |f: &str| last(f).map_or(0, num);
    match protos[at..]
        .iter()
        .rev()
        .find(|p| **p == "tcp" || **p == "udp")
    {
        Some(&"tcp") => v.ports = (port(c[12]), port(c[13])),
        Some(_) => v.ports = (port(c[14]), port(c[15])),
        None => {}
    }
    v
}

fn ours(r: &Value) -> View {
    let s = |k: &str| r[k].as_str().map(str::to_string);
    let ids = |k: &str| -> Vec<u64> {
        r[k].as_array()
            .expect("an array")
            .iter()
            .map(|v| v.as_u64().expect("a VLAN id"))
            .collect()
    };
    let mut vlans = ids("vlans");
    vlans.extend(ids("inner_vlans"));
    View {
        broken: r["malformed"].as_bool().expect("a bool"),
        vni: r["vni"].as_u64(),
        vlans,
        src_ip: s("src_ip"),
        dst_ip: s("dst_ip"),
        proto: r["proto"].as_u64(),
        ports: (
            r["src_port"].as_u64().expect("src_port"),
            r["dst_port"].as_u64().expect("dst_port"),
        ),
        frag: r["frag_id"].as_u64().map(|id| {
            (
                id,
                r["frag_offset"].as_u64().expect("an offset with an id"),
                r["frag_more"].as_bool().expect("a flag with an id"),
            )
        }),
    }
}

#[test]
fn inspect_agrees_with_tshark_on_fragments_extension_headers_vlans_vxlan_and_truncations() {
    if !tshark_available("pcap_tshark") {
        return;
    }
    let frames = frames();
    let dir = tempfile::tempdir().expect("a temp dir");
    let capture = dir.path().join("shapes.pcap");
    std::fs::write(&capture, make_captures::pcap_bytes(&frames)).expect("writing the capture");

    let records = common::inspect_records(&capture);
    let ts = common::tshark_fields(dir.path(), &capture, &FIELDS);
    let lines: Vec<&str> = ts.iter().map(String::as_str).collect();
    assert_eq!(records.len(), frames.len());
    assert_eq!(lines.len(), frames.len());

    let mut failures = Vec::new();
    for (i, ((name, _), (rec, line))) in frames.iter().zip(records.iter().zip(&lines)).enumerate() {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), FIELDS.len(), "frame {i} ({name}): {line:?}");
        let (mut t, o) = (theirs(&cols), ours(rec));
        if std::env::var_os("PCAP_TSHARK_DUMP").is_some() {
            eprintln!("{i} {name}\n  tshark {line:?}\n  ours   {rec}");
        }
        if *name == "trunc_first_fragment_udp_header" {
            // Rule 3 (README): a first fragment holding 4 bytes of a UDP header. tshark, with
            // reassembly off, decodes the ports it has and does not flag the frame (it expects
            // fragments to be partial); `inspect` rejects it: a fragment with more to follow
            // carries a multiple of 8 data bytes (RFC 791 section 3.2), so this one cannot be
            // part of a real datagram, and its transport header is not all there (RFC 8200
            // section 4.5; RFC 1858).
            assert_eq!(o, EMPTY, "frame {i} ({name})");
            assert_eq!(
                (t.broken, t.ports),
                (false, (5353, 53)),
                "frame {i} ({name})"
            );
            continue;
        }
        if name.starts_with("trunc_") {
            // Rule 1 (README): a frame we reject reports no fields; only "broken" is compared.
            assert_eq!(
                o, EMPTY,
                "frame {i} ({name}): ours must be empty and malformed"
            );
            if !t.broken {
                failures.push(format!("{i} {name}: tshark does not flag it: {t:?}"));
            }
            continue;
        }
        if *name == "vxlan_outer_first_fragment" {
            // Rule 2 (README): tshark dissects VXLAN inside an outer first fragment, and flags
            // the inner frame the fragment cuts short as malformed; `inspect` (like the vSwitch)
            // does not decapsulate a fragment, so it reports a valid first fragment of a UDP
            // datagram to 4789. Compare tshark's outer layers with ours.
            assert_eq!(o.vni, None);
            assert_eq!((t.vni, t.broken), (Some(5), true));
            t = View {
                broken: false,
                vni: None,
                vlans: Vec::new(),
                src_ip: occ(cols[2]).first().map(|s| s.to_string()),
                dst_ip: occ(cols[3]).first().map(|s| s.to_string()),
                proto: occ(cols[4]).first().map(|p| num(p)),
                ports: (num(occ(cols[14])[0]), num(occ(cols[15])[0])),
                frag: Some((num(occ(cols[20])[0]), 0, true)),
            };
        }
        if o != t {
            failures.push(format!("{i} {name}:\n  ours   {o:?}\n  tshark {t:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "disagreements:\n{}",
        failures.join("\n")
    );
    eprintln!("pcap_tshark: {} frames agree", frames.len());
}
