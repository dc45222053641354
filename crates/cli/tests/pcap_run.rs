//! Proves that `spillway pcap run` carries `examples/pipeline-in.pcap` through the pipeline of
//! `examples/policy-basic.toml` as the policy says: it runs the built binary in a per-test temp
//! dir, then asserts for every input frame (named by the capture generator) its ingress port,
//! verdict, output port, drop reason and path (the first packet of a connection takes the slow
//! path, every later one the fast path), and reads the output capture back to check the rewrites
//! byte by byte: MACs set to the router / VM / gateway MAC, SNAT source address and port with
//! valid IPv4 and TCP checksums (`spillway_wire::checksum`), the VXLAN delivery decapsulated and
//! the VM's reply encapsulated toward 192.0.2.2 with VNI 1001 and a valid outer IPv4 checksum.
//! It also checks that a bad policy and a missing capture give one-line errors naming the file
//! (and the field), and cross-checks the output's checksums with tshark (skipped without tshark
//! unless `CI=true`).

// Each test binary uses a part of the shared helpers.
#[allow(dead_code)]
mod common;
#[allow(dead_code)]
#[path = "../examples/make_captures.rs"]
mod make_captures;

use std::path::Path;
use std::process::{Command, Output};

use common::{repo_root, tshark, tshark_available};
use pcap_file::pcap::PcapReader;
use serde_json::Value;
use spillway_wire::{Headers, MacAddr, ParseOptions, ParsedFrame, checksum, ip_proto, parse_frame};

const WEB: u32 = 10;
const DB: u32 = 12;
const UPLINK: u32 = 0;
const WEB_MAC: MacAddr = MacAddr([0x02, 0, 0, 0x01, 0, 0x0a]);
const DB_MAC: MacAddr = MacAddr([0x02, 0, 0, 0x01, 0, 0x0c]);
const ROUTER_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0x01, 0x01]);
const UPLINK_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
const GATEWAY_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xfe]);

/// Expected log line of one input frame: name, ingress, path, out port (None = dropped), drop
/// reason as logged.
type Expect = (
    &'static str,
    u32,
    &'static str,
    Option<u32>,
    Option<&'static str>,
);

#[rustfmt::skip]
const EXPECTED: [Expect; 18] = [
    ("db_syn",              WEB,    "slow", Some(DB),     None),
    ("db_syn_ack",          DB,     "fast", Some(WEB),    None),
    ("db_ack",              WEB,    "fast", Some(DB),     None),
    ("db_data",             WEB,    "fast", Some(DB),     None),
    ("db_fin",              WEB,    "fast", Some(DB),     None),
    ("db_fin_ack",          DB,     "fast", Some(WEB),    None),
    ("db_last_ack",         WEB,    "fast", Some(DB),     None),
    ("inet_syn",            WEB,    "slow", Some(UPLINK), None),
    ("inet_syn_ack",        UPLINK, "fast", Some(WEB),    None),
    ("inet_ack",            WEB,    "fast", Some(UPLINK), None),
    ("vxlan_in_syn",        UPLINK, "slow", Some(WEB),    None),
    ("vxlan_reply_syn_ack", WEB,    "fast", Some(UPLINK), None),
    ("drop_spoofed_ip",     WEB,    "slow", None, Some("spoofed_ip")),
    // sg:2 (acme "db") rule 2: the egress deny of 0.0.0.0/0 at priority 300.
    ("drop_sg_deny",        DB,     "slow", None, Some("denied by sg:2 rule 2")),
    ("drop_blackhole",      WEB,    "slow", None, Some("blackhole")),
    ("drop_unknown_vni",    UPLINK, "slow", None, Some("unknown vni 4242")),
    // The neighbour responder answers the web VM's ARP for its gateway, out of its own port.
    ("arp_gateway",         WEB,    "slow", Some(WEB),    None),
    // The parser rejects it before the lookup: neither path.
    ("drop_malformed",      WEB,    "none", None, Some("malformed: ipv4: bad ihl: expected 5, got 3")),
];

fn spillway(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(args)
        .output()
        .expect("running spillway")
}

/// Runs `pcap run` with `config` and `input`, writing into `out`.
fn pcap_run(config: &Path, input: &Path, out: &Path) -> Output {
    spillway(&[
        "pcap".as_ref(),
        "run".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        "--in".as_ref(),
        input.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ])
}

fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let mut r = PcapReader::new(std::fs::File::open(path).expect("the output capture"))
        .expect("a pcap header");
    let mut frames = Vec::new();
    while let Some(p) = r.next_packet() {
        frames.push(p.expect("a pcap record").data.into_owned());
    }
    frames
}

fn v4(h: &Headers) -> ([u8; 4], [u8; 4], u16, u16) {
    let k = h.key.expect("an IP packet");
    let o = |a: spillway_wire::IpAddr16| match a.to_std() {
        std::net::IpAddr::V4(a) => a.octets(),
        other => panic!("expected IPv4, got {other}"),
    };
    (o(k.src_ip), o(k.dst_ip), k.src_port, k.dst_port)
}

/// Asserts the IPv4 header checksum and the TCP checksum of `h` within `frame` are valid.
fn assert_checksums(name: &str, frame: &[u8], h: &Headers) {
    let l3 = h.l3_offset as usize;
    let ihl = (frame[l3] & 0x0f) as usize * 4;
    assert!(
        checksum::ipv4_header_valid(&frame[l3..l3 + ihl]),
        "{name}: IPv4 header checksum"
    );
    let (src, dst, ..) = v4(h);
    let seg = &frame[h.l4_offset as usize..l3 + h.l3_len as usize];
    assert_eq!(h.key.map(|k| k.proto), Some(ip_proto::TCP), "{name}: TCP");
    assert!(
        checksum::verify_l4_v4(src, dst, ip_proto::TCP, seg),
        "{name}: TCP checksum"
    );
}

/// `out` is the IPv4 packet `inp` as a router forwards it: TTL one less, header checksum valid,
/// every other byte the same.
fn assert_routed(name: &str, out: &[u8], inp: &[u8]) {
    assert_eq!(out.len(), inp.len(), "{name}: IP length");
    assert_eq!(out[8], inp[8] - 1, "{name}: TTL");
    assert!(
        checksum::ipv4_header_valid(&out[..20]),
        "{name}: IPv4 checksum"
    );
    for (i, (a, b)) in out.iter().zip(inp).enumerate() {
        assert!(matches!(i, 8 | 10 | 11) || a == b, "{name}: IP byte {i}");
    }
}

fn parse(frame: &[u8]) -> ParsedFrame {
    parse_frame(frame, &ParseOptions::default()).expect("output frames parse")
}

#[test]
fn pipeline_in_pcap_gives_the_expected_verdicts_and_rewrites() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let out_path = dir.path().join("out.pcap");
    let root = repo_root();
    let out = pcap_run(
        &root.join("examples/policy-basic.toml"),
        &root.join("examples/pipeline-in.pcap"),
        &out_path,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pcap run failed: {stderr}");
    let input = make_captures::pipeline_in();
    let log: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(log.len(), input.len());
    assert_eq!(EXPECTED.len(), input.len());

    // The verdict log.
    for (i, (((name, frame), rec), exp)) in input.iter().zip(&log).zip(&EXPECTED).enumerate() {
        let (ename, ingress, path, out_port, reason) = *exp;
        assert_eq!(
            *name, ename,
            "frame {i}: the table follows the generator's order"
        );
        assert_eq!(rec["index"], i, "{name}");
        assert_eq!(rec["ingress"], ingress, "{name}: ingress port");
        assert_eq!(rec["path"], path, "{name}: path");
        assert_eq!(
            rec["verdict"],
            if out_port.is_some() {
                "forward"
            } else {
                "drop"
            },
            "{name}"
        );
        assert_eq!(
            rec["out_port"].as_u64(),
            out_port.map(u64::from),
            "{name}: out port"
        );
        assert_eq!(rec["reason"].as_str(), reason, "{name}: drop reason");
        assert_eq!(rec["len_in"], frame.len(), "{name}: len_in");
    }
    let reasons: std::collections::BTreeSet<_> = EXPECTED.iter().filter_map(|e| e.4).collect();
    assert_eq!(reasons.len(), 5, "five drops, five distinct reasons");

    // The summary on stderr.
    let summary: Value = serde_json::from_str(stderr.lines().last().expect("a summary line"))
        .expect("the summary is JSON");
    assert_eq!(summary["vswitch.rx.packets"], 18);
    assert_eq!(summary["vswitch.tx.forwarded"], 13);
    assert_eq!(summary["vswitch.fast_path.hit"], 9);
    assert_eq!(summary["vswitch.slow_path.new_conn"], 3);

    // The output capture: the forwarded frames, in input order.
    let forwarded: Vec<(&str, &Vec<u8>)> = input
        .iter()
        .zip(&EXPECTED)
        .filter(|(_, e)| e.3.is_some())
        .map(|((n, f), _)| (*n, f))
        .collect();
    let outs = read_pcap(&out_path);
    assert_eq!(outs.len(), forwarded.len());
    for ((name, inp), o) in forwarded.iter().zip(&outs) {
        let p = parse(o);
        let h = &p.outer;
        match *name {
            n if n.starts_with("db_") => {
                // Routed locally: the MACs change and the TTL drops by one (the IPv4 header
                // checksum with it); nothing else.
                let to = if rec_ingress(n) == WEB {
                    DB_MAC
                } else {
                    WEB_MAC
                };
                assert_eq!((h.src_mac, h.dst_mac), (ROUTER_MAC, to), "{n}: MACs");
                assert_eq!(o[12..14], inp[12..14], "{n}: EtherType");
                assert_routed(n, &o[14..], &inp[14..]);
                assert_checksums(n, o, h);
            }
            "inet_syn" | "inet_ack" => {
                assert_eq!(
                    (h.src_mac, h.dst_mac),
                    (UPLINK_MAC, GATEWAY_MAC),
                    "{name}: MACs"
                );
                assert_eq!(
                    v4(h),
                    (
                        [203, 0, 113, 10],
                        [93, 184, 216, 34],
                        make_captures::ACME_SNAT_PORT,
                        80
                    ),
                    "{name}: SNAT to the public address and the first pool port"
                );
                assert_checksums(name, o, h);
            }
            "inet_syn_ack" => {
                assert_eq!(
                    (h.src_mac, h.dst_mac),
                    (ROUTER_MAC, WEB_MAC),
                    "{name}: MACs"
                );
                assert_eq!(
                    v4(h),
                    ([93, 184, 216, 34], [10, 1, 0, 10], 80, 40001),
                    "{name}: un-NAT"
                );
                assert_checksums(name, o, h);
            }
            "vxlan_in_syn" => {
                assert!(p.vxlan.is_none(), "{name}: decapsulated");
                assert_eq!(
                    o.len(),
                    inp.len() - 50,
                    "{name}: the 50 outer bytes are gone"
                );
                assert_eq!(
                    (h.src_mac, h.dst_mac),
                    (ROUTER_MAC, WEB_MAC),
                    "{name}: MACs"
                );
                assert_eq!(
                    o[12..],
                    inp[50 + 12..],
                    "{name}: the inner packet is untouched"
                );
                assert_eq!(v4(h), ([10, 2, 0, 5], [10, 1, 0, 10], 50000, 22));
                assert_checksums(name, o, h);
            }
            "vxlan_reply_syn_ack" => {
                let vx = p.vxlan.expect("encapsulated");
                assert_eq!(vx.vni.get(), 1001, "{name}: VNI");
                assert_eq!(
                    (h.src_mac, h.dst_mac),
                    (UPLINK_MAC, GATEWAY_MAC),
                    "{name}: outer MACs"
                );
                let (src, dst, sport, dport) = v4(h);
                assert_eq!(
                    (src, dst, dport),
                    ([192, 0, 2, 1], [192, 0, 2, 2], 4789),
                    "{name}"
                );
                assert!(
                    sport >= 49152,
                    "{name}: entropy source port {sport} in 49152-65535"
                );
                assert!(
                    checksum::ipv4_header_valid(&o[14..34]),
                    "{name}: outer IPv4 checksum"
                );
                assert_eq!(
                    o[40..42],
                    [0, 0],
                    "{name}: outer UDP checksum 0 (RFC 7348 section 5)"
                );
                assert_eq!(o.len(), inp.len() + 50);
                let inner = p.inner.expect("an inner frame");
                assert_eq!((inner.src_mac, inner.dst_mac), (ROUTER_MAC, ROUTER_MAC));
                assert_eq!(o[50 + 12..50 + 14], inp[12..14], "{name}: EtherType");
                assert_routed(name, &o[50 + 14..], &inp[14..]);
                assert_eq!(v4(&inner), ([10, 1, 0, 10], [10, 2, 0, 5], 22, 50000));
                assert_checksums(name, o, &inner);
            }
            "arp_gateway" => {
                // RFC 826: an ARP reply from the router MAC for 10.1.0.1 to the asker.
                assert_eq!(
                    (h.src_mac, h.dst_mac),
                    (ROUTER_MAC, WEB_MAC),
                    "{name}: MACs"
                );
                assert_eq!(o.len(), 42, "{name}: length");
                assert_eq!(o[20..22], [0, 2], "{name}: opcode reply");
                assert_eq!(o[22..28], ROUTER_MAC.0, "{name}: sender hardware address");
                assert_eq!(o[28..32], [10, 1, 0, 1], "{name}: sender protocol address");
                assert_eq!(o[32..38], WEB_MAC.0, "{name}: target hardware address");
                assert_eq!(o[38..42], [10, 1, 0, 10], "{name}: target protocol address");
            }
            other => panic!("no check for forwarded frame {other}"),
        }
    }

    // tshark's view of the output: every IPv4 and TCP checksum good, VNI 1001 on the one
    // encapsulated frame.
    if !tshark_available("pcap_run tshark cross-check") {
        return;
    }
    let ts = tshark(dir.path())
        .arg("-r")
        .arg(&out_path)
        .args([
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "tcp.check_checksum:TRUE",
        ])
        .args(["-T", "fields", "-E", "occurrence=a", "-E", "separator=/t"])
        .args([
            "-e",
            "ip.checksum.status",
            "-e",
            "tcp.checksum.status",
            "-e",
            "vxlan.vni",
        ])
        .output()
        .expect("running tshark");
    assert!(
        ts.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&ts.stderr)
    );
    let ts = String::from_utf8(ts.stdout).expect("utf-8");
    let lines: Vec<&str> = ts.lines().collect();
    assert_eq!(lines.len(), forwarded.len());
    for ((name, _), line) in forwarded.iter().zip(&lines) {
        if *name == "arp_gateway" {
            continue; // no IP or TCP checksum to check
        }
        let cols: Vec<&str> = line.split('\t').collect();
        // Status 1 is "Good" (0 bad, 2 unverified).
        assert!(
            cols[0].split(',').all(|s| s == "1"),
            "{name}: tshark ip.checksum.status {line:?}"
        );
        assert_eq!(cols[1], "1", "{name}: tshark tcp.checksum.status {line:?}");
        let vni = if *name == "vxlan_reply_syn_ack" {
            "1001"
        } else {
            ""
        };
        assert_eq!(cols[2], vni, "{name}: tshark vxlan.vni");
    }
}

/// The ingress port of a named frame, from the expectation table.
fn rec_ingress(name: &str) -> u32 {
    EXPECTED
        .iter()
        .find(|e| e.0 == name)
        .expect("a named frame")
        .1
}

#[test]
fn bad_policy_error_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let policy = std::fs::read_to_string(repo_root().join("examples/policy-basic.toml"))
        .expect("the example policy");
    let bad = policy.replacen("mac = \"02:00:00:01:00:0a\"", "mac = \"zz\"", 1);
    assert_ne!(bad, policy, "the example still has the web VM's MAC");
    let config = dir.path().join("bad-mac.toml");
    std::fs::write(&config, bad).expect("writing the policy");
    let out_path = dir.path().join("out.pcap");
    let out = pcap_run(
        &config,
        &repo_root().join("examples/pipeline-in.pcap"),
        &out_path,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for want in ["bad-mac.toml", "port[0].mac", "expected", "\"zz\""] {
        assert!(err.contains(want), "stderr lacks {want:?}: {err}");
    }
    assert_eq!(err.lines().count(), 1, "one line, no backtrace: {err}");
    assert!(!out_path.exists(), "no output capture on a config error");
}

#[test]
fn missing_input_capture_error_names_the_file() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let input = dir.path().join("no-such-capture.pcap");
    let out = pcap_run(
        &repo_root().join("examples/policy-basic.toml"),
        &input,
        &dir.path().join("o.pcap"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-capture.pcap"), "{err}");
    assert!(err.contains("No such file or directory"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line, no backtrace: {err}");
}

#[test]
fn missing_policy_error_names_the_file() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = dir.path().join("no-such-policy.toml");
    let out = pcap_run(
        &config,
        &repo_root().join("examples/pipeline-in.pcap"),
        &dir.path().join("o.pcap"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-policy.toml"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line, no backtrace: {err}");
}
