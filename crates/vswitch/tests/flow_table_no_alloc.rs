//! Proves that a `FlowTable` never allocates after construction.
//!
//! A counting global allocator tallies allocations made by the current thread. The test builds a
//! table, then runs a long churn of inserts (fresh, replacing and evicting), single and batch
//! lookups, removes and expiry sweeps, in both full-table policies, and requires the tally to stay
//! unchanged across all of it. Bucket overflow chains and the free list are exercised, since the
//! table runs at capacity for most of the churn.

use spillway_vswitch::Instant;
use spillway_vswitch::flow_table::{EvictBy, FlowTable, FlowTableConfig, FullPolicy};
use std::time::Duration;

#[global_allocator]
static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;

fn allocs() -> u64 {
    spillway_testkit::allocations()
}

#[test]
fn flow_table_does_not_allocate_after_construction() {
    for full in [FullPolicy::EvictLeastValuable, FullPolicy::Reject] {
        let mut t: FlowTable<[u64; 6], u64> = FlowTable::new(FlowTableConfig {
            capacity: 1000,
            idle_timeout: Duration::from_nanos(5_000),
            full,
            evict: EvictBy::FewestPackets,
            evict_sample: 8,
            hash_seed: 9,
        })
        .expect("valid config");
        let keys: Vec<[u64; 6]> = (0..64u64).map(|i| [i * 3, 1, 2, 3, 4, 5]).collect();
        let bytes = vec![64u32; keys.len()];
        let mut out = vec![None; keys.len()];
        let before = allocs();
        for i in 0..50_000u64 {
            let now = Instant(i * 10);
            let k = [i % 1500, 0, 0, 0, 0, i % 7];
            let _ = t.insert(now, k, i, i % 10 != 0);
            t.lookup(now, &k, 100);
            if i % 64 == 0 {
                t.lookup_batch(now, &keys, &bytes, &mut out);
            }
            if i % 5 == 0 {
                t.remove(&[(i / 2) % 1500, 0, 0, 0, 0, (i / 2) % 7]);
            }
            if i % 100 == 0 {
                t.expire(now, 64, |_, _| {});
            }
        }
        assert_eq!(allocs(), before, "{full:?}: allocation after construction");
        t.check_invariants().expect("invariants");
    }
}
