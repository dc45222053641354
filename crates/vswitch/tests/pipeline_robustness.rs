//! Bad input never panics the pipeline and is always accounted for. Arbitrary bytes, and valid
//! frames with random bytes overwritten or cut short, enter on every kind of port; each must come
//! out forwarded or dropped with a counted reason, and the pipeline's invariants (conservation,
//! table bounds) must hold after every frame. The inputs kept by the `pipeline_frames` fuzz
//! target under `tests/fuzz-regressions/` are replayed in the same record format the target uses.

mod common;

use common::*;
use proptest::prelude::*;
use spillway_vswitch::conntrack::ConntrackConfig;
use spillway_vswitch::flow_table::FlowTableConfig;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};

const PORTS: [PortId; 5] = [UPLINK, WEB, WEB2, DB, GLOBEX];

fn small() -> Pipeline {
    pipeline(PipelineConfig {
        flow_table: FlowTableConfig {
            capacity: 64,
            ..FlowTableConfig::default()
        },
        conntrack: ConntrackConfig {
            capacity: 32,
            ..ConntrackConfig::default()
        },
        ..PipelineConfig::default()
    })
}

/// Valid frames of every shape the example policy forwards, to be mutated.
fn seeds() -> Vec<(PortId, Vec<u8>)> {
    let syn = tcp(
        WEB_MAC,
        ACME_ROUTER,
        (WEB_IP, 40000),
        (DB_IP, 5432),
        SYN,
        b"abc",
    );
    let inner = to_acme(ACME_ROUTER, (REMOTE_VM, 1), (WEB_IP, 22), SYN);
    vec![
        (WEB, syn),
        (UPLINK, vxlan(&inner, REMOTE_VTEP, VTEP, ACME_VNI)),
        (
            WEB,
            udp(WEB_MAC, ACME_ROUTER, (WEB_IP, 5), (INTERNET_HOST, 53), b"q"),
        ),
        (
            WEB,
            ping(WEB_MAC, ACME_ROUTER, WEB_IP, INTERNET_HOST, 9, false),
        ),
        (
            UPLINK,
            tcp(
                GATEWAY_MAC,
                UPLINK_MAC,
                (INTERNET_HOST, 80),
                (ACME_PUBLIC, 1024),
                SYN | ACK,
                b"",
            ),
        ),
    ]
}

fn feed(p: &mut Pipeline, now: u64, port: PortId, frame: &[u8]) {
    let mut buf = PacketBuf::default();
    if buf.load(frame).is_ok() {
        let before = p.counters().rx_packets;
        let v = p.process(Instant(now), port, &mut buf);
        assert_eq!(p.counters().rx_packets, before + 1);
        if let Verdict::Forward(_) = v {
            assert!(!buf.is_empty());
        }
    }
    p.expire(Instant(now), 64);
    p.check_invariants()
        .expect("invariants hold after every frame");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_on_any_port_are_dropped_or_forwarded_never_panic(
        frames in prop::collection::vec((0..PORTS.len(), prop::collection::vec(any::<u8>(), 0..200)), 1..20)
    ) {
        let mut p = small();
        for (i, (port, f)) in frames.iter().enumerate() {
            feed(&mut p, i as u64 + 1, PORTS[*port], f);
        }
    }

    #[test]
    fn mutated_and_truncated_valid_frames_never_panic(
        ops in prop::collection::vec((0usize..5, prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4), any::<prop::sample::Index>()), 1..30)
    ) {
        let seeds = seeds();
        let mut p = small();
        for (i, (which, edits, cut)) in ops.iter().enumerate() {
            let (port, mut f) = seeds[*which].clone();
            for (at, byte) in edits {
                let at = at.index(f.len());
                f[at] = *byte;
            }
            let keep = cut.index(f.len() + 1);
            // Keep whole frames most of the time so mutated headers reach deep layers.
            if keep < f.len() / 2 {
                f.truncate(keep);
            }
            feed(&mut p, i as u64 + 1, port, &f);
        }
    }
}

#[test]
fn fuzz_regressions_replay() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz-regressions");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("regression dir exists") {
        // `pipeline_frames` inputs lie directly here; other targets' have their own directory.
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            continue;
        }
        let data = std::fs::read(&path).expect("readable");
        let mut p = small();
        let mut rest = &data[..];
        let mut now = 1u64;
        while rest.len() >= 4 {
            let port = PORTS[rest[0] as usize % PORTS.len()];
            now += u64::from(rest[1]) * 100_000_000;
            let len = usize::from(u16::from_le_bytes([rest[2], rest[3]])).min(rest.len() - 4);
            feed(&mut p, now, port, &rest[4..4 + len]);
            rest = &rest[4 + len..];
        }
        n += 1;
    }
    assert!(n > 0, "at least the seed input is kept");
}
