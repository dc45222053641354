//! Proves that fragmented traffic allocates nothing per packet after warm-up: 200 SNATed UDP
//! datagrams of three fragments each (first fragment through the slow path and into the fragment
//! table, later fragments followed and the datagram released), plus later fragments without a
//! first and overlapping fragments (counted drops), go through `Pipeline::process` under a
//! counting global allocator (per thread, so the harness's threads do not interfere). Every
//! frame is built before counting starts.

mod common;

use common::*;
use spillway_vswitch::pipeline::PipelineConfig;
use spillway_vswitch::{DropReason, Instant, PacketBuf, Verdict};
use spillway_wire::build::FrameBuilder;

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

fn datagram(id: u16) -> Vec<Vec<u8>> {
    let f = FrameBuilder::new()
        .eth(WEB_MAC, ACME_ROUTER)
        .ipv4(WEB_IP, INTERNET_HOST)
        .udp(5353, 53)
        .payload(&[3; 3000])
        .build();
    ipv4_fragments(&f, 14, 1480, id)
}

#[test]
fn fragment_tracking_allocates_nothing_per_packet() {
    let mut p = pipeline(PipelineConfig::default());
    let warm = datagram(0);
    let frames: Vec<Vec<Vec<u8>>> = (1..=200).map(datagram).collect();
    let mut buf = PacketBuf::default();
    let mut now = 1_000_000_000u64;
    for f in &warm {
        buf.load(f).expect("fits");
        assert_eq!(
            p.process(Instant(now), WEB, &mut buf),
            Verdict::Forward(UPLINK)
        );
    }
    let before = spillway_testkit::allocations();
    for d in &frames {
        // Out of order first: the later fragment has no first yet.
        buf.load(&d[2]).expect("fits");
        let v = p.process(Instant(now), WEB, &mut buf);
        assert_eq!(v, Verdict::Drop(DropReason::FragmentNoFirst));
        for f in &d[..2] {
            buf.load(f).expect("fits");
            assert_eq!(
                p.process(Instant(now), WEB, &mut buf),
                Verdict::Forward(UPLINK)
            );
        }
        // The middle fragment again overlaps and poisons the datagram.
        buf.load(&d[1]).expect("fits");
        let v = p.process(Instant(now), WEB, &mut buf);
        assert_eq!(v, Verdict::Drop(DropReason::FragmentOverlap));
        now += 1_000_000;
    }
    let allocs = spillway_testkit::allocations() - before;
    assert_eq!(allocs, 0, "{allocs} allocations for {} frames", 4 * 200);
    assert_eq!(p.frag_counters().tracked, 201);
}
