//! The control plane's checks, run on every backend (`local.rs`, `etcd.rs`): the same rules
//! must hold whichever store is under them.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use spillway_cluster::{
    Cluster, ClusterError, HostRecord, Kv, PlaneState, Pool, Reserve, TenantLoad, Write,
};

pub const TTL: Duration = Duration::from_secs(30);

fn record(tenants: &[(u32, f64, f64)], spare: u32) -> HostRecord {
    HostRecord {
        tenants: tenants
            .iter()
            .map(|&(tenant, mean_pps, norm_variance)| TenantLoad {
                tenant,
                mean_pps,
                norm_variance,
            })
            .collect(),
        spare_cores: spare,
        plane: PlaneState::Shadow,
    }
}

fn held(c: &Cluster<impl Kv>, pool: &str) -> u32 {
    c.pool(pool)
        .expect("reads the pool")
        .held
        .iter()
        .map(|(_, n)| n)
        .sum()
}

/// Ten reservers ask a 16-core pool for 3 cores each at the same moment: exactly five get
/// them. Then they churn (reserve, check, release) and the cores held never exceed the
/// capacity at any read.
pub fn ten_reservers_never_double_book<K: Kv>(c: &Cluster<K>, tag: &str) {
    let pool = format!("pool-{tag}");
    let pool_lease = c.lease(TTL).expect("lease");
    c.offer(&pool, 16, pool_lease).expect("offers");
    let barrier = Barrier::new(10);
    let granted: Vec<bool> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..10)
            .map(|i| {
                let (pool, barrier) = (&pool, &barrier);
                s.spawn(move || {
                    let me = format!("r{i}-{tag}");
                    let lease = c.lease(TTL).expect("lease");
                    barrier.wait();
                    let first = c.reserve(pool, &me, 3, lease).expect("reserves");
                    barrier.wait();
                    // Churn: sizes 1-4, each grant checked against the capacity.
                    for round in 0..15u32 {
                        let cores = 1 + (i + round) % 4;
                        match c.reserve(pool, &me, cores, lease).expect("reserves") {
                            Reserve::Granted => {
                                let sum = held(c, pool);
                                assert!(sum <= 16, "{me} round {round}: {sum} cores held of 16");
                            }
                            Reserve::Refused { free_cores } => assert!(free_cores < cores),
                        }
                        if round % 3 == 2 {
                            c.release(pool, &me).expect("releases");
                        }
                    }
                    first == Reserve::Granted
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reserver"))
            .collect()
    });
    let winners = granted.iter().filter(|g| **g).count();
    assert_eq!(
        winners, 5,
        "16 cores in 3s: five reservers, got {granted:?}"
    );
    assert!(held(c, &pool) <= 16);
    c.kv().revoke(pool_lease).expect("revokes");
}

/// A host's record and a reserver's cores go with their lease; a pool whose lease went offers
/// nothing.
pub fn leases_take_their_keys<K: Kv>(c: &Cluster<K>, tag: &str) {
    let host = format!("host-{tag}");
    let pool = format!("pool-{tag}");
    let lease = c.lease(TTL).expect("lease");
    c.publish(&host, &record(&[(1, 1_000.0, 0.2)], 4), lease)
        .expect("publishes");
    assert!(c.hosts().expect("reads").iter().any(|(h, _)| *h == host));
    let pool_lease = c.lease(TTL).expect("lease");
    c.offer(&pool, 8, pool_lease).expect("offers");
    let r = c.lease(TTL).expect("lease");
    assert_eq!(
        c.reserve(&pool, "a", 6, r).expect("reserves"),
        Reserve::Granted
    );
    assert_eq!(
        c.reserve(&pool, "b", 3, lease).expect("reserves"),
        Reserve::Refused { free_cores: 2 }
    );
    // The reserver's lease goes: its six cores are free again.
    c.kv().revoke(r).expect("revokes");
    let empty = |capacity| Pool {
        capacity,
        held: vec![],
        endpoint: None,
    };
    assert_eq!(c.pool(&pool).expect("reads"), empty(Some(8)));
    assert_eq!(
        c.reserve(&pool, "b", 3, lease).expect("reserves"),
        Reserve::Granted
    );
    // A reservation replaces the reserver's own: 8 of 8 is fine for "b" alone.
    assert_eq!(
        c.reserve(&pool, "b", 8, lease).expect("reserves"),
        Reserve::Granted
    );
    assert_eq!(held(c, &pool), 8);
    // Anywhere: the pool with most free takes it; none with room is `None`.
    let other = format!("other-{tag}");
    let other_lease = c.lease(TTL).expect("lease");
    c.offer(&other, 4, other_lease).expect("offers");
    assert_eq!(
        c.reserve_anywhere("c", 3, lease, &[])
            .expect("reserves")
            .as_deref(),
        Some(other.as_str()),
        "{:?}",
        c.pools()
    );
    assert_eq!(
        c.reserve_anywhere("d", 2, lease, &[]).expect("reserves"),
        None
    );
    // A pool to avoid (its plane failed) is not used even with room.
    c.release(&other, "c").expect("releases");
    assert_eq!(
        c.reserve_anywhere("d", 2, lease, std::slice::from_ref(&other))
            .expect("reserves"),
        None
    );
    c.kv().revoke(other_lease).expect("revokes");
    // The pool's lease goes: no capacity, no new reservations.
    c.kv().revoke(pool_lease).expect("revokes");
    assert!(matches!(
        c.reserve(&pool, "b", 1, lease),
        Err(ClusterError::NoSuchPool(_))
    ));
    c.kv().revoke(lease).expect("revokes");
    assert!(!c.hosts().expect("reads").iter().any(|(h, _)| *h == host));
    assert_eq!(c.pool(&pool).expect("reads"), empty(None));
    assert!(matches!(
        c.reserve(&pool, "a/../b", 1, lease),
        Err(ClusterError::BadName { .. })
    ));
}

/// A pool host's service endpoint and a reserver's token: the grant its service checks
/// needs both the cores and the token, and both go with the reserver's release or lease.
pub fn grants_carry_a_token_and_go_with_their_lease<K: Kv>(c: &Cluster<K>, tag: &str) {
    let pool = format!("tokpool-{tag}");
    let pool_lease = c.lease(TTL).expect("lease");
    c.offer(&pool, 4, pool_lease).expect("offers");
    c.advertise(&pool, "192.0.2.102:7400", pool_lease)
        .expect("advertises");
    assert_eq!(
        c.pool(&pool).expect("reads").endpoint.as_deref(),
        Some("192.0.2.102:7400")
    );
    let lease = c.lease(TTL).expect("lease");
    assert_eq!(
        c.reserve(&pool, "a", 2, lease).expect("reserves"),
        Reserve::Granted
    );
    // Cores without a token are no grant: the service refuses the link.
    assert_eq!(c.grant(&pool, "a").expect("reads"), None);
    c.set_token(&pool, "a", "00ff", lease).expect("sets");
    let g = c.grant(&pool, "a").expect("reads").expect("a grant");
    assert_eq!((g.cores, g.token.as_str()), (2, "00ff"));
    // Another reserver's grant is not this one's.
    assert_eq!(c.grant(&pool, "b").expect("reads"), None);
    c.release(&pool, "a").expect("releases");
    assert_eq!(c.grant(&pool, "a").expect("reads"), None);
    // A token alone (a reservation that lapsed) grants nothing either.
    c.set_token(&pool, "a", "00ff", lease).expect("sets");
    assert_eq!(c.grant(&pool, "a").expect("reads"), None);
    c.reserve(&pool, "a", 1, lease).expect("reserves");
    assert!(c.grant(&pool, "a").expect("reads").is_some());
    c.kv().revoke(lease).expect("revokes");
    assert_eq!(c.grant(&pool, "a").expect("reads"), None);
    assert!(matches!(
        c.set_token(&pool, "a", "a token with spaces", pool_lease),
        Err(ClusterError::BadValue { .. })
    ));
    c.kv().revoke(pool_lease).expect("revokes");
    assert_eq!(c.pool(&pool).expect("reads").endpoint, None);
}

/// A lease nobody keeps alive lapses and takes its record; one kept alive does not.
pub fn unkept_leases_lapse<K: Kv>(c: &Cluster<K>, tag: &str) {
    let kept = c.lease(Duration::from_secs(2)).expect("lease");
    let lapsing = c.lease(Duration::from_secs(2)).expect("lease");
    c.publish(&format!("kept-{tag}"), &record(&[], 1), kept)
        .expect("publishes");
    c.publish(&format!("lapsing-{tag}"), &record(&[], 1), lapsing)
        .expect("publishes");
    let start = Instant::now();
    loop {
        c.kv().keep_alive(kept).expect("keeps alive");
        let hosts = c.hosts().expect("reads");
        let has = |name: String| hosts.iter().any(|(h, _)| *h == name);
        assert!(has(format!("kept-{tag}")), "a kept lease lapsed");
        if !has(format!("lapsing-{tag}")) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "a 2 s lease outlived 15 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "lapsed before its ttl"
    );
    c.kv().revoke(kept).expect("revokes");
}

/// The baseline a watcher sees follows the hosts as they publish and go; a record that does
/// not parse is an error naming its key.
pub fn the_watched_baseline_follows_the_hosts<K: Kv + Clone + 'static>(c: &Cluster<K>, tag: &str) {
    let rx = c.watch_baseline().expect("watches");
    let wait_for = |hosts: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let b = rx.recv_timeout(left).expect("a baseline within 10 s");
            if b.hosts == hosts {
                return b;
            }
        }
    };
    let start = c.baseline().expect("reads").hosts;
    let a = c.lease(TTL).expect("lease");
    let b = c.lease(TTL).expect("lease");
    c.publish(&format!("a-{tag}"), &record(&[(1, 1_000.0, 0.1)], 2), a)
        .expect("publishes");
    c.publish(&format!("b-{tag}"), &record(&[(2, 3_000.0, 0.5)], 6), b)
        .expect("publishes");
    let both = wait_for(start + 2);
    if start == 0 {
        assert!((both.norm_variance - 0.4).abs() < 1e-12, "{both:?}");
        assert_eq!(both.spare_cores, 8);
    }
    c.kv().revoke(b).expect("revokes");
    let one = wait_for(start + 1);
    if start == 0 {
        assert!((one.norm_variance - 0.1).abs() < 1e-12, "{one:?}");
    }
    // A value that is not a host record.
    let bad = format!("/spillway/hosts/bad-{tag}");
    c.kv()
        .txn(
            &[],
            vec![Write::Put {
                key: bad.clone(),
                value: b"{".to_vec(),
                lease: Some(a),
            }],
        )
        .expect("writes");
    let e = c.hosts().expect_err("a bad record is an error");
    assert!(e.to_string().contains(&bad), "{e}");
    c.kv().revoke(a).expect("revokes");
}
