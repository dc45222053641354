//! The control plane's checks on the embedded store (`common/mod.rs` says what each proves).

mod common;

use spillway_cluster::Cluster;
use spillway_cluster::local::LocalKv;

#[test]
fn ten_reservers_never_double_book() {
    common::ten_reservers_never_double_book(&Cluster::new(LocalKv::new()), "local");
}

#[test]
fn leases_take_their_keys() {
    common::leases_take_their_keys(&Cluster::new(LocalKv::new()), "local");
}

#[test]
fn unkept_leases_lapse() {
    common::unkept_leases_lapse(&Cluster::new(LocalKv::new()), "local");
}

#[test]
fn the_watched_baseline_follows_the_hosts() {
    common::the_watched_baseline_follows_the_hosts(&Cluster::new(LocalKv::new()), "local");
}

#[test]
fn grants_carry_a_token_and_go_with_their_lease() {
    common::grants_carry_a_token_and_go_with_their_lease(&Cluster::new(LocalKv::new()), "local");
}
