//! Proves that `Conntrack` never allocates after construction, even under churn at capacity.
//!
//! A counting global allocator tallies allocations made by the current thread. The tracker is
//! filled to capacity, then driven through many rounds of creates (with reclaim of expired
//! connections), lookups, updates, removes and expiry sweeps. Removals leave tombstones in the
//! hashbrown index; the index is reserved at four times the connection capacity precisely so that
//! hashbrown cleans them by rehashing in place instead of growing. The tally must not move.

use spillway_vswitch::conntrack::{Conntrack, ConntrackConfig, CtDir, tcp_flags};
use spillway_vswitch::{Instant, TenantId};
use spillway_wire::{FlowKey, IpAddr16, ip_proto};

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

fn allocs() -> u64 {
    spillway_testkit::allocations()
}

fn key(i: u64, tcp: bool) -> FlowKey {
    let [a, b, c, d] = (i as u32).to_be_bytes();
    FlowKey {
        src_ip: IpAddr16::from_v4([10, a, b, c]),
        dst_ip: IpAddr16::from_v4([10, 9, d, 1]),
        src_port: (i % 50_000) as u16,
        dst_port: 80,
        proto: if tcp { ip_proto::TCP } else { ip_proto::UDP },
    }
}

#[test]
fn conntrack_does_not_allocate_after_construction() {
    let mut t = Conntrack::new(ConntrackConfig {
        capacity: 1024,
        ..ConntrackConfig::default()
    })
    .expect("valid config");
    let before = allocs();
    let s = 1_000_000_000u64;
    for i in 0..200_000u64 {
        // 1 ms per step: UDP connections expire after 30,000 steps.
        let now = Instant(s + i * 1_000_000);
        let tcp = i % 3 == 0;
        let k = key(i, tcp);
        let flags = if tcp { tcp_flags::SYN } else { 0 };
        if let Ok(h) = t.create(
            now,
            TenantId((i % 4) as u32),
            k,
            k.reversed(),
            flags,
            i,
            |_| {},
        ) {
            let _ = t.update(now, h, CtDir::Original, flags, 60);
            if i % 7 == 0 {
                t.remove(h);
            }
        }
        let _ = t.lookup(now, TenantId((i % 4) as u32), &key(i / 2, tcp));
        if i % 50 == 0 {
            t.expire(now, 64, |_| {});
        }
    }
    assert_eq!(allocs(), before, "allocation after construction");
    assert!(
        t.counters().expired > 0 && t.counters().rejected_full > 0,
        "churn ran at capacity"
    );
    t.check_invariants().expect("invariants");
}
