//! The pool service (`spillway_rt::remote::pool`) against a real etcd (started by the test):
//! it serves a host's plane only with that host's reservation on this pool and its token, and
//! refuses everything else with a reason, before it starts anything.
//!
//! Needs root (the pool's cgroup) and `etcd`; under `CI=true` a missing one fails the test,
//! elsewhere it prints why it skips.

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use spillway_cluster::{Cluster, Reserve, Store};
use spillway_rt::remote::link;
use spillway_rt::remote::pool::{PoolService, PoolSpec};

fn hello(host: &str, token: &str) -> serde_json::Value {
    serde_json::json!({
        "host": host, "token": token, "lanes": 1, "workers": 1,
        "clock_origin_ns": 0, "testbed": "",
    })
}

/// Sends `doc` to the service at `addr` and returns its answer.
fn ask(addr: std::net::SocketAddr, doc: &serde_json::Value) -> serde_json::Value {
    let mut tcp = TcpStream::connect(addr).expect("the service listens");
    link::send_json(&mut tcp, doc).expect("hello sent");
    link::recv_json(&mut tcp, Duration::from_secs(5)).expect("an answer")
}

#[test]
fn the_pool_service_serves_only_a_reserved_host_with_its_token() {
    let Some(etcd) = spillway_testkit::Etcd::start("poolsvc") else {
        return;
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let dir = tempfile::tempdir().expect("temp dir");
    let pool = format!("pool-{}", std::process::id());
    let mut svc = PoolService::start(PoolSpec {
        pool_host: pool.clone(),
        listen,
        netns: None,
        etcd: vec![etcd.endpoint.clone()],
        state_dir: dir.path().to_owned(),
        instance: format!("ps{:x}-pool", std::process::id() % 0xfffff),
        // Never started: every link below is refused before a plane would be.
        plane_exe: "/bin/false".into(),
        cpus: "0".into(),
        memory_max: None,
        spill: toml::Table::new(),
        cores: 2,
    })
    .expect("the pool service starts");
    let cluster = Cluster::new(Store::etcd(std::slice::from_ref(&etcd.endpoint)).unwrap());
    let lease = cluster.lease(Duration::from_secs(30)).unwrap();
    cluster.offer(&pool, 2, lease).unwrap();
    assert_eq!(
        cluster.reserve(&pool, "a", 1, lease).unwrap(),
        Reserve::Granted
    );
    cluster.set_token(&pool, "a", "good-token", lease).unwrap();

    let refused = |doc: serde_json::Value, why: &str| {
        let a = ask(listen, &doc);
        assert_eq!(a["ok"], false, "{a}");
        let e = a["error"].as_str().unwrap_or_default();
        assert!(e.contains(why), "expected {why:?}: {a}");
    };
    // The reserved host with another token; a host with no reservation here; a token alone
    // (cores given back); a hello that is not one.
    refused(hello("a", "bad-token"), "wrong token");
    refused(hello("a", "good-toke"), "wrong token");
    refused(hello("b", "good-token"), "holds no reservation");
    refused(hello("../a", "good-token"), "hello.host");
    let mut bad = hello("a", "good-token");
    bad["lanes"] = serde_json::json!(0);
    refused(bad, "hello.lanes");
    cluster.release(&pool, "a").unwrap();
    cluster.set_token(&pool, "a", "good-token", lease).unwrap();
    refused(hello("a", "good-token"), "holds no reservation");
    // Bytes that are no hello: the link is dropped with a reason, and the service goes on.
    let mut tcp = TcpStream::connect(listen).unwrap();
    std::io::Write::write_all(&mut tcp, b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let _ = link::recv_json(&mut tcp, Duration::from_secs(5));
    refused(hello("b", "x"), "holds no reservation");

    let status = svc.status();
    assert_eq!(status["served"], 0, "{status}");
    assert_eq!(status["refused"], 8, "{status}");
    assert_eq!(status["guests"], serde_json::json!([]), "{status}");
    svc.stop();
}
