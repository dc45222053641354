//! The control plane's checks on a real etcd (Debian's `etcd-server`), each test with an etcd
//! of its own on loopback ports of its own and a temporary data folder, both removed at the
//! end, also on failure. Under `CI=true` a missing etcd fails the tests (`.ci/run` installs
//! it); elsewhere they say so and skip.
#![cfg(feature = "etcd")]

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_cluster::etcd::EtcdKv;
use spillway_cluster::{Cluster, Kv};

/// An etcd of the test's own, killed and its data removed on drop.
struct Etcd {
    child: Child,
    _data: tempfile::TempDir,
    endpoint: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free right now (the kernel's choice for an ephemeral bind).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("an ephemeral port")
        .port()
}

fn etcd(name: &str) -> Option<(Etcd, Cluster<EtcdKv>)> {
    if !spillway_testkit::prerequisites(&["etcd"]) {
        return None;
    }
    let data = tempfile::Builder::new()
        .prefix(&format!("spillway-etcd-{name}-"))
        .tempdir()
        .expect("a data folder");
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", name, "--data-dir"])
        .arg(data.path())
        .args([
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("{name}={peer_url}")])
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd starts");
    let e = Etcd {
        child,
        _data: data,
        endpoint,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match EtcdKv::connect(std::slice::from_ref(&e.endpoint))
            .and_then(|kv| kv.get_prefix("/spillway/").map(|_| kv))
        {
            Ok(kv) => return Some((e, Cluster::new(kv))),
            Err(err) if Instant::now() > deadline => {
                panic!("etcd at {} did not answer within 20 s: {err}", e.endpoint)
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
