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
//! verdicts, bytes and fragment counters must agree too. So are packets with a TTL of 0, 1 or 2,
//! which the router answers with time exceeded (or forwards with TTL 1) on either path, with the
//! same error bytes and counters.

mod common;

use common::sequence::*;
use common::*;
use proptest::prelude::*;
use spillway_vswitch::Instant;

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

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        16 => (0usize..8, any::<bool>(), 0..FLAGS.len(), 0u16..3, prop::bool::weighted(0.05))
            .prop_map(|(flow, reply, flags, nat_guess, spoof)| Op::Packet { flow, reply, flags, nat_guess, spoof }),
        4 => (0usize..8, 0u16..3).prop_map(|(flow, nat_guess)| Op::Handshake { flow, nat_guess }),
        3 => (0usize..8, any::<bool>(), 0u16..3, 0u16..4, prop::bool::weighted(0.2))
            .prop_map(|(flow, reply, nat_guess, id, swap)| Op::Fragmented { flow, reply, nat_guess, id, swap }),
        2 => (0usize..8, any::<bool>(), 0u16..3, 0u8..3)
            .prop_map(|(flow, reply, nat_guess, ttl)| Op::Expiring { flow, reply, nat_guess, ttl }),
        3 => (1u64..500).prop_map(Op::Advance),
        1 => (20_000u64..200_000).prop_map(Op::Advance),
        1 => Just(Op::Expire),
        1 => Just(Op::Reload),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn fast_path_and_slow_path_agree_byte_for_byte(
        flows in prop::collection::vec(flow(), FLOWS),
        ops in prop::collection::vec(op(), 1..150),
    ) {
        if let Err(e) = check_sequence(&flows, &ops) {
            prop_assert!(false, "{}", e);
        }
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
        // Forwarded first packets install entries, so the repeat must be a hit; a packet the
        // router answers (an ICMP error back out of its port) installs nothing.
        if matches!(v1, spillway_vswitch::Verdict::Forward(out) if out != port) {
            prop_assert!(fast2, "forwarded packet's repeat should hit its entry");
        }
    }
}
