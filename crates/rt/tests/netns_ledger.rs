//! Namespaces, veth links and the cleanup ledger against the real kernel and iproute2. Two
//! namespaces joined by a veth pair carry a UDP datagram (so the address, route and link
//! commands really configure what they say); failing commands report their command line and
//! ip's stderr; and a testbed whose process "crashes" (the ledger is leaked, not cleaned up)
//! with a namespace, a veth pair, a cgroup, a process and a file is removed completely by
//! `Ledger::recover`, which is then checked with `ip netns list` and `ip link`. Names are unique
//! per test and process, and every test cleans up through a ledger or guard even when an
//! assertion fails. Needs root.

mod oslab;

use std::net::{Ipv4Addr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use oslab::{Lab, in_netns, unique};
use spillway_rt::host::cgroup::CgroupSpec;
use spillway_rt::host::ledger::{Ledger, LedgerEntry, LedgerScope};
use spillway_rt::host::netns::{self, NetnsError};
use spillway_wire::MacAddr;

/// Recovers a leaked ledger when dropped, so a failed assertion after the simulated crash does
/// not leave the testbed behind.
struct RecoverOnDrop {
    dir: PathBuf,
    instance: String,
}

impl Drop for RecoverOnDrop {
    fn drop(&mut self) {
        // The test's process runs `sleep`, which the default scope does not allow.
        let mut scope = LedgerScope::new(&self.dir, &self.instance);
        for sleep in ["/usr/bin/sleep", "/bin/sleep"] {
            scope = scope.allow_exe(std::path::Path::new(sleep));
        }
        let _ = Ledger::recover_in(&self.dir, &self.instance, &scope);
    }
}

fn ip_output(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn veth_between_two_namespaces_carries_udp() {
    if !oslab::require_root("network namespaces") {
        return;
    }
    let mut lab = Lab::new();
    let (ns_a, ns_b) = (unique("swn"), unique("swn"));
    let (va, vb) = (unique("swv"), unique("swv"));
    lab.ledger.netns_add(&ns_a).unwrap();
    lab.ledger.netns_add(&ns_b).unwrap();
    assert!(netns::netns_exists(&ns_a).unwrap());
    lab.ledger.veth_add(&va, &vb).unwrap();
    lab.ledger.link_set_netns(&va, &ns_a).unwrap();
    lab.ledger.link_set_netns(&vb, &ns_b).unwrap();
    assert!(netns::link_exists(&va, Some(&ns_a)).unwrap());
    assert!(
        !netns::link_exists(&va, None).unwrap(),
        "moved out of the root namespace"
    );

    let (a, b) = (Some(ns_a.as_str()), Some(ns_b.as_str()));
    netns::link_set_mtu(a, &va, 1400).unwrap();
    netns::link_set_mac(a, &va, MacAddr([2, 0, 0, 0, 0xa, 1])).unwrap();
    netns::addr_add(a, &va, "10.88.1.1/24").unwrap();
    netns::addr_add(b, &vb, "10.88.2.1/24").unwrap();
    for (ns, dev) in [(a, va.as_str()), (b, vb.as_str())] {
        netns::link_set_up(ns, dev).unwrap();
        netns::link_set_up(ns, "lo").unwrap();
    }
    // Different subnets on each side: only the routes make them reachable.
    netns::route_add(a, "10.88.2.0/24", None, Some(&va)).unwrap();
    netns::route_add(b, "10.88.1.0/24", None, Some(&vb)).unwrap();

    let link = ip_output(&["-n", &ns_a, "link", "show", "dev", &va]);
    assert!(link.contains("mtu 1400"), "{link}");
    assert!(link.contains("02:00:00:00:0a:01"), "{link}");

    let (tx, rx) = std::sync::mpsc::channel();
    let server = oslab::spawn_in_netns(&ns_b, move || {
        let s = UdpSocket::bind((Ipv4Addr::new(10, 88, 2, 1), 6000)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        tx.send(()).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = s.recv_from(&mut buf).expect("datagram over the veth");
        (buf[..n].to_vec(), from)
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    in_netns(&ns_a, || {
        let s = UdpSocket::bind((Ipv4Addr::new(10, 88, 1, 1), 0)).unwrap();
        s.send_to(b"across", (Ipv4Addr::new(10, 88, 2, 1), 6000))
            .unwrap();
    });
    let (payload, from) = server.join().unwrap();
    assert_eq!(payload, b"across");
    assert_eq!(from.ip(), Ipv4Addr::new(10, 88, 1, 1));
}

#[test]
fn failing_commands_report_the_command_line_and_stderr() {
    if !oslab::require_root("network namespaces") {
        return;
    }
    let mut lab = Lab::new();
    let ns = unique("swn");
    lab.ledger.netns_add(&ns).unwrap();
    let err = netns::link_set_up(Some(&ns), "nosuchdev0").unwrap_err();
    match &err {
        NetnsError::Failed { cmd, stderr, .. } => {
            assert_eq!(cmd, &format!("ip -n {ns} link set dev nosuchdev0 up"));
            assert!(
                stderr.contains("nosuchdev0") || stderr.contains("Cannot find device"),
                "{stderr}"
            );
        }
        other => panic!("expected Failed, got {other}"),
    }
    // Adding a namespace that exists is an error too, not silently accepted.
    assert!(matches!(
        netns::netns_add(&ns),
        Err(NetnsError::Failed { .. })
    ));
}

#[test]
fn sysctl_and_run_in_netns_act_inside_the_namespace_only() {
    if !oslab::require_root("network namespaces") {
        return;
    }
    let mut lab = Lab::new();
    let ns = unique("swn");
    lab.ledger.netns_add(&ns).unwrap();
    let read = |ns: &str| {
        let out = netns::run_in_netns(ns, "cat")
            .arg("/proc/sys/net/ipv4/ip_forward")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    assert_eq!(read(&ns), "0", "a fresh namespace does not forward");
    let root_before = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
    netns::sysctl(Some(&ns), "net.ipv4.ip_forward", "1").unwrap();
    assert_eq!(read(&ns), "1");
    let root_after = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap();
    assert_eq!(
        root_before, root_after,
        "the root namespace must be untouched"
    );
}

#[test]
fn ethtool_offload_works_or_reports_a_missing_tool_clearly() {
    if !oslab::require_root("network namespaces") {
        return;
    }
    let mut lab = Lab::new();
    let ns = unique("swn");
    let (va, vb) = (unique("swv"), unique("swv"));
    lab.ledger.netns_add(&ns).unwrap();
    lab.ledger.veth_add(&va, &vb).unwrap();
    lab.ledger.link_set_netns(&va, &ns).unwrap();
    match netns::ethtool_offload(Some(&ns), &va, "tx", false) {
        Ok(()) => {}
        Err(NetnsError::ToolMissing { tool, cmd, .. }) => {
            assert_eq!(tool, "ethtool");
            assert!(cmd.contains(&format!("ethtool -K {va} tx off")), "{cmd}");
        }
        Err(e) => panic!("ethtool present but failed: {e}"),
    }
}

#[test]
fn recover_removes_everything_a_crashed_run_left() {
    if !oslab::require_root("network namespaces and cgroups") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let instance = unique("cr");
    let _guard = RecoverOnDrop {
        dir: dir.path().to_owned(),
        instance: instance.clone(),
    };
    // Names with the instance's prefix: recovery removes nothing else.
    let ns = format!("{instance}-n");
    let (va, vb) = (format!("{instance}-a"), format!("{instance}-b"));
    let cg_name = format!("{instance}-cg");
    let file = dir.path().join("ring.shm");

    let mut ledger = Ledger::open(dir.path(), &instance).unwrap();
    ledger.netns_add(&ns).unwrap();
    ledger.veth_add(&va, &vb).unwrap();
    ledger.link_set_netns(&vb, &ns).unwrap();
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let cpu = spillway_rt::host::cgroup::parse_cpu_list(&online).unwrap()[0].to_string();
    let cg = ledger
        .create_cgroup(&cg_name, &CgroupSpec::new(cpu))
        .unwrap();
    let cg_dirs = cg.dirs().to_vec();
    // A process inside the cgroup, as the spill plane would be. Started directly (not through
    // `ip netns exec`, which replaces itself), so the executable recorded stays its own.
    let mut child = ledger.spawn(Command::new("sleep").arg("30")).unwrap();
    let sleep_exe = std::fs::read_link(format!("/proc/{}/exe", child.id())).unwrap();
    cg.add_pid(child.id()).unwrap();
    ledger.record(LedgerEntry::File(file.clone())).unwrap();
    std::fs::write(&file, b"x").unwrap();
    assert_eq!(ledger.entries().len(), 1 + 2 + 1 + cg_dirs.len() + 1 + 1);

    // The crash: no cleanup runs, no destructor kills anything.
    std::mem::forget(cg);
    ledger.leak();
    assert!(netns::netns_exists(&ns).unwrap());
    assert!(netns::link_exists(&va, None).unwrap());

    // The next run starts by recovering.
    assert!(matches!(
        Ledger::open(dir.path(), &instance),
        Err(spillway_rt::host::ledger::LedgerError::Stale { .. })
    ));
    let scope = LedgerScope::new(dir.path(), &instance).allow_exe(&sleep_exe);
    let report = Ledger::recover_in(dir.path(), &instance, &scope)
        .unwrap()
        .expect("a ledger to recover");
    assert!(report.is_clean(), "{report:#?}");
    assert!(report.ledger_removed);
    assert!(report.removed.contains(&LedgerEntry::Netns(ns.clone())));
    assert!(
        report
            .removed
            .iter()
            .any(|e| matches!(e, LedgerEntry::Pid { .. }))
    );

    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "sleep must have been killed, not finished: {status:?}"
    );
    assert!(
        !ip_output(&["netns", "list"])
            .lines()
            .any(|l| l.split_whitespace().next() == Some(&ns))
    );
    let links = ip_output(&["-br", "link"]);
    for name in [&va, &vb] {
        assert!(!links.contains(name.as_str()), "{name} left in:\n{links}");
    }
    for d in &cg_dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    assert!(!file.exists());
    assert!(!Ledger::path_for(dir.path(), &instance).exists());
    // And a fresh run can start.
    let fresh = Ledger::open(dir.path(), &instance).unwrap();
    drop(fresh);
}

#[test]
fn a_recycled_pid_is_never_killed() {
    if !oslab::require_root("killing recorded processes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let instance = unique("pid");
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let mut ledger = Ledger::open(dir.path(), &instance).unwrap();
    // Same pid, different start time: what a recycled pid looks like.
    let LedgerEntry::Pid {
        pid,
        start_time_ticks,
        exe,
    } = LedgerEntry::pid(child.id()).unwrap()
    else {
        unreachable!()
    };
    ledger
        .record(LedgerEntry::Pid {
            pid,
            start_time_ticks: start_time_ticks + 1,
            exe,
        })
        .unwrap();
    let report = ledger.cleanup();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.already_gone.len(), 1);
    assert!(
        child.try_wait().unwrap().is_none(),
        "an unrelated process was killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
