//! End to end: `spillway run` with a `[cluster]` on a real etcd (started by the test).
//!
//! The DPU process publishes this host's record under a lease: its tenant's load once URSched
//! has a full set of variance samples (VM `a` pings VM `b` meanwhile), its spare cores and its
//! plane's state. A second host's record, published by the test, moves the cluster baseline;
//! the DPU process's watch brings it back, and `ctl status` shows it in use.
//!
//! The host has no isolatable core (4 cores: 2 for tenants, 2 reserved) and a fast path of
//! 10 packets/s, so the ping is pressure URSched cannot answer here: it falls back, and the
//! agent reserves the plane's cores on the pool host the test offers (a transaction in etcd).
//! When the ping stops and the pressure is gone, it releases them. When the daemon stops, its
//! record is gone at once (it revokes its lease), not after the lease's time to live.
//!
//! Needs root, `ip`, `ping` and `etcd`; under `CI=true` a missing one fails the test, elsewhere
//! it prints why it skips.

#[allow(dead_code)]
mod common;

use std::time::Duration;

use common::{Daemon, Killed, wait_for};

use spillway_cluster::etcd::EtcdKv;
use spillway_cluster::{Cluster, HostRecord, Kv, PlaneState, TenantLoad};

const BIN: &str = env!("CARGO_BIN_EXE_spillway");

fn testbed(name: &str, state: &std::path::Path, endpoint: &str) -> String {
    format!(
        r#"
[testbed]
name = "{name}"
state_dir = "{state}"
[spill]
cpus = "1"
memory_max = "512M"
[cluster]
host = "host-{name}"
etcd = ["{endpoint}"]
lease_ttl_s = 30
[fabric.host]
cores = 4
tenant_cores = 2
reserve_cores = 2
[fabric.dpu]
hw_pps_limit = 10.0
{policy}
[[vm]]
name = "a"
port = 1
[[vm]]
name = "b"
port = 2
"#,
        policy = common::two_port_policy("10.71.0", Some("icmp")),
        state = state.display(),
    )
}

#[test]
fn the_dpu_process_publishes_its_host_and_follows_the_cluster_baseline() {
    if !spillway_testkit::prerequisites(&["ip", "ping"]) {
        return;
    }
    let Some(etcd) = spillway_testkit::Etcd::start("rtcluster") else {
        return;
    };
    let name = format!("c{:x}", std::process::id() % 0xfffff);
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("testbed.toml");
    std::fs::write(&config, testbed(&name, dir.path(), &etcd.endpoint)).expect("testbed");
    let mut daemon = Daemon(Some(common::spawn_run(
        BIN,
        &config,
        dir.path(),
        "auto",
        "warn",
        Duration::from_secs(30),
    )));
    let log = || std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default();
    // Traffic for tenant 1, so that URSched has its load to publish.
    let ping = Killed(
        common::netns_exec(&format!("{name}-a"), "ping")
            .args(["-i", "0.05", "-c", "200", "10.71.0.2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ping starts"),
    );
    let cluster = Cluster::new(
        EtcdKv::connect(std::slice::from_ref(&etcd.endpoint)).expect("the test reaches etcd"),
    );
    let host = format!("host-{name}");
    let mine = |c: &Cluster<EtcdKv>| -> Option<HostRecord> {
        c.hosts()
            .expect("reads hosts")
            .into_iter()
            .find(|(h, _)| *h == host)
            .map(|(_, r)| r)
    };
    let record = wait_for(Duration::from_secs(20), "tenant 1's load published", || {
        mine(&cluster).filter(|r| r.tenants.iter().any(|t| t.tenant == 1 && t.mean_pps > 0.0))
    });
    assert_eq!(record.plane, PlaneState::Idle, "{record:?}");
    // A second host with a calm tenant: the baseline comes back to the DPU process.
    let lease = cluster.lease(Duration::from_secs(30)).expect("lease");
    let calm = HostRecord {
        tenants: vec![TenantLoad {
            tenant: 9,
            mean_pps: 1e6,
            norm_variance: 0.0,
        }],
        spare_cores: 3,
        plane: PlaneState::Idle,
    };
    cluster.publish("other", &calm, lease).expect("publishes");
    // Both baselines are rate-weighted means, so the calm million-pps tenant pulls the
    // cluster's far below what this host's pinging tenant alone gives.
    let expected = cluster.baseline().expect("reads").norm_variance;
    assert!(expected < 0.01, "{expected}");
    let status = wait_for(
        Duration::from_secs(15),
        "the new baseline in ctl status",
        || {
            let s = common::ctl(BIN, &config, &["status"]);
            let c = &s["cluster"];
            let calm = c["baseline"].as_f64().is_some_and(|b| b < 0.01);
            (c["connected"] == true && calm).then(|| s.clone())
        },
    );
    let c = &status["cluster"];
    assert_eq!(c["host"], host.as_str(), "{status}");
    assert!(c["published"].as_u64().unwrap_or(0) >= 1, "{status}");
    // Pressure with no core here: the plane's cores are reserved on the test's pool host.
    let pool = format!("pool-{name}");
    let pool_lease = cluster.lease(Duration::from_secs(30)).expect("lease");
    cluster.offer(&pool, 4, pool_lease).expect("offers");
    let held = |c: &Cluster<EtcdKv>| c.pool(&pool).expect("reads the pool").held;
    wait_for(Duration::from_secs(15), "the pool cores reserved", || {
        held(&cluster)
            .iter()
            .any(|(who, cores)| *who == host && *cores == 2)
            .then_some(())
    });
    let s = common::ctl(BIN, &config, &["status"]);
    assert_eq!(s["cluster"]["reserved"]["pool"], pool.as_str(), "{s}");
    assert_eq!(s["phase"], "idle", "no plane on a host without a core: {s}");
    // The pressure goes with the ping: the cores go back.
    drop(ping);
    wait_for(Duration::from_secs(15), "the pool cores released", || {
        held(&cluster).is_empty().then_some(())
    });
    // Stop: the record goes with the revoked lease, long before its 30 s would run out.
    let exit = daemon.stop().expect("daemon exits");
    assert!(exit.success(), "daemon exit {exit}: {}", log());
    wait_for(Duration::from_secs(5), "the record gone at exit", || {
        mine(&cluster).is_none().then_some(())
    });
    cluster.kv().revoke(lease).ok();
    cluster.kv().revoke(pool_lease).ok();
}
