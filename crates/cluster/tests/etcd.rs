//! The control plane's checks on a real etcd (Debian's `etcd-server`), each test with an etcd
//! of its own (`spillway_testkit::Etcd`: loopback ports of its own, a temporary data folder,
//! both gone at the end, also on failure). Under `CI=true` a missing etcd fails the tests
//! (`.ci/run` installs it); elsewhere they say so and skip.
#![cfg(feature = "etcd")]

mod common;

use std::time::{Duration, Instant};

use spillway_cluster::etcd::EtcdKv;
use spillway_cluster::{Cluster, Kv};
use spillway_testkit::Etcd;

fn etcd(name: &str) -> Option<(Etcd, Cluster<EtcdKv>)> {
    let e = Etcd::start(name)?;
    // Healthy is not always serving yet: retry the first request briefly.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match EtcdKv::connect(std::slice::from_ref(&e.endpoint))
            .and_then(|kv| kv.get_prefix("/spillway/").map(|_| kv))
        {
            Ok(kv) => return Some((e, Cluster::new(kv))),
            Err(err) if Instant::now() > deadline => {
                panic!("etcd at {} did not answer: {err}", e.endpoint)
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn ten_reservers_never_double_book() {
    let Some((_etcd, c)) = etcd("reserve") else {
        return;
    };
    common::ten_reservers_never_double_book(&c, "etcd");
}

#[test]
fn leases_take_their_keys() {
    let Some((_etcd, c)) = etcd("leases") else {
        return;
    };
    common::leases_take_their_keys(&c, "etcd");
}

#[test]
fn unkept_leases_lapse() {
    let Some((_etcd, c)) = etcd("lapse") else {
        return;
    };
    common::unkept_leases_lapse(&c, "etcd");
}

#[test]
fn the_watched_baseline_follows_the_hosts() {
    let Some((_etcd, c)) = etcd("watch") else {
        return;
    };
    common::the_watched_baseline_follows_the_hosts(&c, "etcd");
}

#[test]
fn grants_carry_a_token_and_go_with_their_lease() {
    let Some((_etcd, c)) = etcd("grants") else {
        return;
    };
    common::grants_carry_a_token_and_go_with_their_lease(&c, "etcd");
}
