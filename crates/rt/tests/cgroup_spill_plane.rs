//! The spill plane's cgroup against the real cgroup filesystem (v1 or v2, whichever this machine
//! offers): a cgroup created with a cpuset and a memory limit reads both back, takes a real
//! process (seen in /proc/<pid>/cgroup), kills it on `kill_all`, and leaves no directory behind
//! after `remove` or drop. Invalid values fail with errors naming the file and the value, and
//! leave nothing half-made. Each test uses a unique cgroup name and kills/removes on drop, so
//! they run in parallel and clean up after a failed assertion too. Needs root.

mod oslab;

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::time::Duration;

use oslab::unique;
use spillway_rt::host::cgroup::{Cgroup, CgroupError, CgroupSpec, CgroupVersion, parse_cpu_list};

/// A `sleep 30` that is killed and reaped when the guard drops, whatever happened.
struct Sleeper(Child);

impl Sleeper {
    fn spawn() -> Sleeper {
        Sleeper(
            Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("spawn sleep"),
        )
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
    /// Waits (bounded) for the process to end and returns the signal that ended it.
    fn wait_for_signal(&mut self) -> Option<i32> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status.signal();
            }
            assert!(std::time::Instant::now() < deadline, "sleep not killed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first online CPU: a cpuset every machine accepts.
fn first_cpu() -> String {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    parse_cpu_list(&online).unwrap()[0].to_string()
}

const MIB_64: u64 = 64 << 20;

#[test]
fn cgroup_confines_a_process_then_kill_all_and_remove_leave_nothing() {
    if !oslab::require_root("cgroup filesystem writes") {
        return;
    }
    let name = unique("cg");
    let spec = CgroupSpec {
        cpus: first_cpu(),
        mems: "0".into(),
        memory_max: Some(MIB_64),
    };
    let cg = Cgroup::create(&name, &spec).unwrap();
    let dirs = cg.dirs().to_vec();
    assert_eq!(
        dirs.len(),
        if cg.version() == CgroupVersion::V1 {
            2
        } else {
            1
        }
    );
    assert!(dirs.iter().all(|d| d.is_dir()));
    assert_eq!(cg.cpus().unwrap(), spec.cpus);
    assert_eq!(cg.memory_max().unwrap(), Some(MIB_64));

    let mut sleeper = Sleeper::spawn();
    cg.add_pid(sleeper.pid()).unwrap();
    assert_eq!(cg.pids().unwrap(), vec![sleeper.pid()]);
    // The kernel's view: every hierarchy we use places the process in spillway/<name>.
    let membership = std::fs::read_to_string(format!("/proc/{}/cgroup", sleeper.pid())).unwrap();
    let suffix = format!("/spillway/{name}");
    let wanted: &[&str] = match cg.version() {
        CgroupVersion::V1 => &["cpuset", "memory"],
        CgroupVersion::V2 => &[""],
    };
    for controller in wanted {
        assert!(
            membership.lines().any(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
                ctrls.split(',').any(|c| c == *controller) && path.ends_with(&suffix)
            }),
            "{controller:?} membership missing in:\n{membership}"
        );
    }

    cg.kill_all().unwrap();
    assert_eq!(sleeper.wait_for_signal(), Some(9));
    assert!(cg.pids().unwrap().is_empty());
    cg.remove().unwrap();
    for d in &dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[test]
fn dropping_a_cgroup_kills_its_members_and_removes_it() {
    if !oslab::require_root("cgroup filesystem writes") {
        return;
    }
    let cg = Cgroup::create(&unique("cg"), &CgroupSpec::new(first_cpu())).unwrap();
    assert_eq!(cg.memory_max().unwrap(), None, "no limit asked, none set");
    let dirs = cg.dirs().to_vec();
    let mut sleeper = Sleeper::spawn();
    cg.add_pid(sleeper.pid()).unwrap();
    drop(cg);
    assert_eq!(sleeper.wait_for_signal(), Some(9));
    for d in &dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[test]
fn a_cpuset_the_kernel_rejects_names_file_and_value_and_leaves_nothing() {
    if !oslab::require_root("cgroup filesystem writes") {
        return;
    }
    let name = unique("cg");
    // Parses fine, but no machine here has CPU 4000.
    let err = Cgroup::create(&name, &CgroupSpec::new("4000")).unwrap_err();
    match &err {
        CgroupError::Write { path, value, .. } => {
            assert!(path.ends_with("cpuset.cpus"), "{err}");
            assert_eq!(value, "4000");
        }
        other => panic!("expected a write error, got {other}"),
    }
    assert!(err.to_string().contains("cpuset.cpus") && err.to_string().contains("4000"));
    let hierarchy = spillway_rt::host::cgroup::Hierarchy::detect().unwrap();
    for d in hierarchy.dirs_for(&name) {
        assert!(
            !d.exists(),
            "{} left behind after a failed create",
            d.display()
        );
    }
}

#[test]
fn creating_an_existing_cgroup_fails_without_touching_it() {
    if !oslab::require_root("cgroup filesystem writes") {
        return;
    }
    let name = unique("cg");
    let cg = Cgroup::create(&name, &CgroupSpec::new(first_cpu())).unwrap();
    let err = Cgroup::create(&name, &CgroupSpec::new(first_cpu())).unwrap_err();
    assert!(matches!(err, CgroupError::Exists { .. }), "{err}");
    assert!(
        cg.dirs().iter().all(|d| d.is_dir()),
        "the first one must survive"
    );
    cg.remove().unwrap();
}

#[test]
fn set_cpus_moves_the_cgroup_to_other_cores() {
    if !oslab::require_root("cgroup filesystem writes") {
        return;
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let cpus = parse_cpu_list(&online).unwrap();
    let cg = Cgroup::create(&unique("cg"), &CgroupSpec::new(cpus[0].to_string())).unwrap();
    let last = cpus[cpus.len() - 1].to_string();
    cg.set_cpus(&last).unwrap();
    assert_eq!(cg.cpus().unwrap(), last);
    cg.remove().unwrap();
}
