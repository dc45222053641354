//! Least privilege for the spill-plane process.
//!
//! The DPU process starts the plane as root (it has to: the plane is moved into a cgroup and
//! handed the vNIC rings by a root process), but once the plane has mapped its rings, built its
//! pipeline and started its model, nothing it does needs a privilege. Measured with
//! `strace -f` on a plane carrying TCP and UDP through both delivery paths, taking a new VM
//! memory over the control socket, and stopping on SIGTERM: after set-up it only reads and
//! writes descriptors it already holds (ring doorbells, the control socket, stderr), receives
//! VM memfds on that socket (`recvmsg`), maps and unmaps them, allocates, polls, and exits.
//!
//! [`drop_privileges`] therefore, in this order:
//! 1. refuses to run unless the process has a single thread (credentials changed with raw
//!    syscalls are per thread; a second thread would keep root);
//! 2. sets `PR_SET_NO_NEW_PRIVS` (no set-uid or file-capability gain through `execve`, and the
//!    precondition for an unprivileged seccomp filter);
//! 3. clears the ambient capabilities and empties the bounding set (while it still has
//!    `CAP_SETPCAP`);
//! 4. `setgroups([])`, `setresgid(gid, gid, gid)`, `setresuid(uid, uid, uid)`: leaving uid 0
//!    clears the permitted and effective capabilities; then `capset` clears the inheritable ones;
//! 5. marks the process not dumpable, so a process of the same uid can neither `ptrace` it nor
//!    read its `/proc/<pid>/mem` (which holds tenant traffic and VM memory), and it dumps no core;
//! 6. checks the result in `/proc/self/status` and fails if any field is not what it should be;
//! 7. installs a seccomp allow-list ([`SeccompMode::Kill`]: any other system call kills the
//!    process; [`SeccompMode::Log`]: it is logged by the kernel and allowed, for development).
//!
//! The plane's shard threads (`fabric.dpu.shards > 1`) are started after all this, so they
//! inherit the dropped credentials and the filter: the allow-list lets `clone` make threads
//! only (`CLONE_THREAD`), answers `clone3` with ENOSYS (glibc then uses `clone`), and lets a
//! thread pin itself (`sched_setaffinity` of pid 0). The threads are not named (that is a
//! `prctl`, which stays refused).
//!
//! Any failure is an error and the plane exits: a plane that could not drop its privileges does
//! not run. The DPU process, still root, can stop, restart and kill it as before.

use std::collections::BTreeMap;
use std::io;

use rustix::thread::{CapabilitySet, CapabilitySets};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The uid and gid the plane drops to unless the testbed names others: `nobody`/`nogroup`.
pub const NOBODY: u32 = 65534;

/// What the seccomp filter does with a system call outside the allow-list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeccompMode {
    /// Kill the whole process (`SECCOMP_RET_KILL_PROCESS`): the production setting.
    Kill,
    /// Allow it and have the kernel log it (`SECCOMP_RET_LOG`, in the kernel log or audit log):
    /// for finding what a changed plane needs.
    Log,
}

impl SeccompMode {
    /// The name used in the testbed file.
    pub fn name(self) -> &'static str {
        match self {
            SeccompMode::Kill => "kill",
            SeccompMode::Log => "log",
        }
    }

    /// The mode named `name` in the testbed file.
    pub fn from_name(name: &str) -> Option<Self> {
        [SeccompMode::Kill, SeccompMode::Log]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// Whom the plane runs as after set-up, and how strictly it is confined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanePrivileges {
    /// The uid to drop to (never 0).
    pub uid: u32,
    /// The gid to drop to (never 0).
    pub gid: u32,
    /// The seccomp filter's action for a call outside the allow-list.
    pub seccomp: SeccompMode,
}

impl Default for PlanePrivileges {
    fn default() -> Self {
        PlanePrivileges {
            uid: NOBODY,
            gid: NOBODY,
            seccomp: SeccompMode::Kill,
        }
    }
}

/// Dropping privileges failed; the plane must not run.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// A system call of the sequence failed.
    #[error("dropping privileges: {step} failed: {source}")]
    Os {
        /// The step, as the system call is named.
        step: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The process has more than one thread, so a per-thread credential change would leave
    /// other threads privileged.
    #[error(
        "dropping privileges: the process has {threads} threads; privileges are dropped while it \
         has one, so that no thread keeps root"
    )]
    Threads {
        /// Threads seen in `/proc/self/status`.
        threads: String,
    },
    /// The uid or gid asked for is 0 or `(uid_t)-1`.
    #[error("dropping privileges: {field} = {value} is not an unprivileged id (1 to 4294967294)")]
    BadId {
        /// `uid` or `gid`.
        field: &'static str,
        /// The value.
        value: u32,
    },
    /// After the drop, `/proc/self/status` does not show what it should.
    #[error(
        "after dropping privileges /proc/self/status has {field} {actual:?}, expected {expected}"
    )]
    Check {
        /// The status field.
        field: &'static str,
        /// What it should be.
        expected: String,
        /// What it is.
        actual: String,
    },
    /// The seccomp filter could not be built or installed.
    #[error("dropping privileges: seccomp filter: {0}")]
    Seccomp(String),
}

fn os(step: &'static str) -> impl FnOnce(rustix::io::Errno) -> PrivilegeError {
    move |e| PrivilegeError::Os {
        step,
        source: e.into(),
    }
}

/// Drops the calling process to `p` (see the module documentation for the sequence).
pub fn drop_privileges(p: &PlanePrivileges) -> Result<(), PrivilegeError> {
    for (field, value) in [("uid", p.uid), ("gid", p.gid)] {
        if value == 0 || value == u32::MAX {
            return Err(PrivilegeError::BadId { field, value });
        }
    }
    // Built before anything is dropped: it allocates and reads nothing privileged, but an error
    // here should leave the process as it was.
    let filter = seccomp_filter(p.seccomp, rustix::process::getpid().as_raw_nonzero().get())?;
    let status = read_status()?;
    let threads = status_field(&status, "Threads").unwrap_or("?");
    if threads != "1" {
        return Err(PrivilegeError::Threads {
            threads: threads.to_string(),
        });
    }
    rustix::thread::set_no_new_privs(true).map_err(os("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    rustix::thread::clear_ambient_capability_set().map_err(os("prctl(PR_CAP_AMBIENT)"))?;
    // Every capability number the kernel knows: it answers EINVAL past the last one.
    for cap in 0..64u32 {
        match rustix::thread::remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(
            1 << cap,
        )) {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL) => break,
            Err(e) => return Err(os("prctl(PR_CAPBSET_DROP)")(e)),
        }
    }
    // Group list and gid first: once the uid is not 0 they can no longer be changed. The
    // process has one thread (checked above), so the per-thread calls change the process.
    rustix::thread::set_thread_groups(&[]).map_err(os("setgroups"))?;
    let gid = rustix::process::Gid::from_raw(p.gid);
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(os("setresgid"))?;
    let uid = rustix::process::Uid::from_raw(p.uid);
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(os("setresuid"))?;
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(os("capset"))?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(os("prctl(PR_SET_DUMPABLE)"))?;
    check_status(&read_status()?, p.uid, p.gid)?;
    let no_clone3 = clone3_filter()?;
    seccompiler::apply_filter(&no_clone3).map_err(|e| PrivilegeError::Seccomp(e.to_string()))?;
    seccompiler::apply_filter(&filter).map_err(|e| PrivilegeError::Seccomp(e.to_string()))?;
    Ok(())
}

/// The second filter: `clone3` fails with ENOSYS (its flags live in memory, which a filter
/// cannot read, so it cannot be limited to threads; glibc then uses `clone`, whose flags the
/// allow-list checks). The kernel runs every filter and takes the strictest answer: ENOSYS
/// over the allow-list's "allow", and the allow-list's "kill" over this one's "allow".
fn clone3_filter() -> Result<BpfProgram, PrivilegeError> {
    let err = |e: seccompiler::BackendError| PrivilegeError::Seccomp(e.to_string());
    let rules: BTreeMap<i64, Vec<SeccompRule>> = [(libc::SYS_clone3, Vec::new())].into();
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| PrivilegeError::Seccomp(e.to_string()))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(e))
}

fn read_status() -> Result<String, PrivilegeError> {
    std::fs::read_to_string("/proc/self/status").map_err(|source| PrivilegeError::Os {
        step: "reading /proc/self/status",
        source,
    })
}

/// The value of `field` in a `/proc/<pid>/status` text, trimmed.
pub fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == field).then(|| v.trim())
    })
}

/// Checks a `/proc/<pid>/status` text for a process dropped to `uid`/`gid`: all four uids and
/// gids, no supplementary groups, all five capability sets empty, `NoNewPrivs` set.
pub fn check_status(status: &str, uid: u32, gid: u32) -> Result<(), PrivilegeError> {
    let field = |name: &'static str| status_field(status, name).unwrap_or("(missing)");
    let ids = |name: &'static str, want: u32| -> Result<(), PrivilegeError> {
        let actual = field(name);
        let ok = actual.split_whitespace().count() == 4
            && actual.split_whitespace().all(|v| v == want.to_string());
        if ok {
            Ok(())
        } else {
            Err(PrivilegeError::Check {
                field: name,
                expected: format!("{want} four times (real, effective, saved, filesystem)"),
                actual: actual.to_string(),
            })
        }
    };
    ids("Uid", uid)?;
    ids("Gid", gid)?;
    let want = |name: &'static str, expected: &str| -> Result<(), PrivilegeError> {
        let actual = field(name);
        if actual == expected {
            Ok(())
        } else {
            Err(PrivilegeError::Check {
                field: name,
                expected: expected.to_string(),
                actual: actual.to_string(),
            })
        }
    };
    want("Groups", "")?;
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        want(caps, "0000000000000000")?;
    }
    want("NoNewPrivs", "1")
}

/// The system calls the plane makes after set-up (from `strace -f` of real runs; see the module
/// documentation), plus what the standard library needs to panic, abort and sleep. Everything
/// works on descriptors the plane already holds: no `open`, `socket`, `connect`, `execve`,
/// `ptrace`, `ioctl` or `prctl`.
fn allowed_syscalls() -> Vec<i64> {
    let mut v = vec![
        // Rings, doorbells, the control socket (VM memfds arrive by SCM_RIGHTS), stderr.
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_readv,
        libc::SYS_writev,
        libc::SYS_recvmsg,
        libc::SYS_recvfrom,
        libc::SYS_sendmsg,
        libc::SYS_sendto,
        libc::SYS_ppoll,
        libc::SYS_close,
        libc::SYS_dup,
        libc::SYS_fcntl,
        libc::SYS_fstat,
        // Memory: the allocator, and mapping a VM's memfd (mmap/mprotect without PROT_EXEC are
        // added below with their condition).
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_madvise,
        libc::SYS_brk,
        // Time, identity for logs and statistics, randomness for hash maps.
        libc::SYS_clock_gettime,
        libc::SYS_clock_nanosleep,
        libc::SYS_nanosleep,
        libc::SYS_sched_yield,
        libc::SYS_sched_getaffinity,
        libc::SYS_getpid,
        libc::SYS_gettid,
        libc::SYS_getrandom,
        libc::SYS_futex,
        // Signals (SIGTERM's handler, a restarted poll after SIGSTOP/SIGCONT) and exit.
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigaction,
        libc::SYS_sigaltstack,
        libc::SYS_restart_syscall,
        libc::SYS_exit,
        libc::SYS_exit_group,
        // The plane's shard threads, started after the drop (see `thread_rules`): what glibc
        // does in a new thread, and `clone3`, which the second filter answers with ENOSYS so
        // that glibc falls back to `clone`, whose flags the first one checks.
        libc::SYS_set_robust_list,
        libc::SYS_rseq,
        libc::SYS_clone3,
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(libc::SYS_poll);
    v
}

/// The BPF program: the allow-list above; `mmap`/`mprotect` only without `PROT_EXEC`; `tgkill`
/// only at the process itself (`abort` after a panic); anything else per `mode`.
fn seccomp_filter(mode: SeccompMode, pid: i32) -> Result<BpfProgram, PrivilegeError> {
    let err = |e: seccompiler::BackendError| PrivilegeError::Seccomp(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed_syscalls()
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    let no_exec = || -> Result<Vec<SeccompRule>, PrivilegeError> {
        let c = SeccompCondition::new(
            2,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
            0,
        )
        .map_err(err)?;
        Ok(vec![SeccompRule::new(vec![c]).map_err(err)?])
    };
    rules.insert(libc::SYS_mmap, no_exec()?);
    rules.insert(libc::SYS_mprotect, no_exec()?);
    let own = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, pid as u64)
        .map_err(err)?;
    rules.insert(
        libc::SYS_tgkill,
        vec![SeccompRule::new(vec![own]).map_err(err)?],
    );
    // Threads, not processes: `clone` only with CLONE_THREAD (a new process could outlive the
    // plane's cgroup accounting); affinity only of the calling thread (pid 0).
    let thread = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
        libc::CLONE_THREAD as u64,
    )
    .map_err(err)?;
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![thread]).map_err(err)?],
    );
    let me = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, 0).map_err(err)?;
    rules.insert(
        libc::SYS_sched_setaffinity,
        vec![SeccompRule::new(vec![me]).map_err(err)?],
    );
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| {
        PrivilegeError::Seccomp(format!(
            "{e} (the plane's allow-list is for x86_64 and aarch64)"
        ))
    })?;
    let mismatch = match mode {
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
    };
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch).map_err(err)?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DROPPED: &str = "Name:\tspillway\nUid:\t65534\t65534\t65534\t65534\n\
        Gid:\t65534\t65534\t65534\t65534\nGroups:\t\nCapInh:\t0000000000000000\n\
        CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n\
        CapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";

    #[test]
    fn status_of_a_dropped_process_passes_the_check() {
        check_status(DROPPED, NOBODY, NOBODY).expect("dropped");
        assert_eq!(status_field(DROPPED, "Seccomp"), Some("2"));
        assert_eq!(status_field(DROPPED, "Groups"), Some(""));
    }

    #[test]
    fn status_check_names_each_field_still_privileged() {
        let cases = [
            (
                "Uid:\t65534\t65534\t65534\t65534",
                "Uid:\t65534\t0\t65534\t65534",
                "Uid",
            ),
            (
                "Gid:\t65534\t65534\t65534\t65534",
                "Gid:\t0\t0\t0\t0",
                "Gid",
            ),
            ("Groups:\t", "Groups:\t0", "Groups"),
            (
                "CapBnd:\t0000000000000000",
                "CapBnd:\t000001ffffffffff",
                "CapBnd",
            ),
            (
                "CapInh:\t0000000000000000",
                "CapInh:\t0000000000000400",
                "CapInh",
            ),
            ("NoNewPrivs:\t1", "NoNewPrivs:\t0", "NoNewPrivs"),
            ("CapEff:\t0000000000000000\n", "", "CapEff"),
        ];
        for (from, to, field) in cases {
            let status = DROPPED.replace(from, to);
            match check_status(&status, NOBODY, NOBODY) {
                Err(PrivilegeError::Check { field: f, .. }) => assert_eq!(f, field, "{to}"),
                other => panic!("{to}: {other:?}"),
            }
        }
    }

    #[test]
    fn root_and_minus_one_are_refused_as_target_ids() {
        for p in [
            PlanePrivileges {
                uid: 0,
                ..PlanePrivileges::default()
            },
            PlanePrivileges {
                gid: u32::MAX,
                ..PlanePrivileges::default()
            },
        ] {
            assert!(matches!(
                drop_privileges(&p),
                Err(PrivilegeError::BadId { .. })
            ));
        }
    }

    #[test]
    fn seccomp_modes_round_trip_their_names() {
        for m in [SeccompMode::Kill, SeccompMode::Log] {
            assert_eq!(SeccompMode::from_name(m.name()), Some(m));
        }
        assert_eq!(SeccompMode::from_name("off"), None);
    }

    /// The plane's threads are made with `clone`: `clone3` (whose flags a filter cannot read)
    /// fails with ENOSYS, so glibc falls back, and a `clone` without `CLONE_THREAD` (a new
    /// process) kills the plane. A child installs both filters (built in the parent) and tries
    /// each.
    #[test]
    fn seccomp_answers_clone3_with_enosys_and_kills_a_clone_that_makes_a_process() {
        let no_clone3 = clone3_filter().expect("filter builds");
        let filter = seccomp_filter(SeccompMode::Kill, 0).expect("filter builds");
        // SAFETY: the child only makes system calls (prctl, seccomp, clone3, clone, _exit)
        // before it exits; it touches no lock or allocator state another thread may have held.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            if seccompiler::apply_filter(&no_clone3).is_err()
                || seccompiler::apply_filter(&filter).is_err()
            {
                // SAFETY: _exit ends the child without running the parent's destructors.
                unsafe { libc::_exit(3) };
            }
            // SAFETY: clone3 with no arguments; the filter answers before the kernel reads them.
            let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
            // SAFETY: reading this thread's errno.
            let errno = unsafe { *libc::__errno_location() };
            if r != -1 || errno != libc::ENOSYS {
                // SAFETY: as above.
                unsafe { libc::_exit(5) };
            }
            // A fork by `clone`: must not return.
            // SAFETY: clone with SIGCHLD and no stack behaves as fork; both sides _exit below.
            unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) };
            // SAFETY: as above.
            unsafe { libc::_exit(6) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid pointer to an int.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
            "the child should die of SIGSYS at the fork; it exited with {} \
             (3: a filter refused, 5: clone3 was not ENOSYS, 6: the fork was allowed)",
            libc::WEXITSTATUS(status)
        );
    }

    /// Forks a child that installs the plane's filter (built in the parent: no allocation after
    /// the fork) and then calls `socket(2)`, which is not on the list. Returns how it ended.
    fn child_with_filter(mode: SeccompMode) -> (bool, i32) {
        let filter = seccomp_filter(mode, 0).expect("filter builds");
        // SAFETY: the child only makes system calls (prctl, seccomp, socket, _exit) before it
        // exits; it touches no lock or allocator state another thread may have held at fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            if seccompiler::apply_filter(&filter).is_err() {
                // SAFETY: _exit ends the child without running the parent's destructors.
                unsafe { libc::_exit(3) };
            }
            // SAFETY: socket(2) takes plain integers.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
            // SAFETY: as above.
            unsafe { libc::_exit(if fd >= 0 { 0 } else { 4 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child with a valid pointer to an int.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        if libc::WIFSIGNALED(status) {
            (true, libc::WTERMSIG(status))
        } else {
            (false, libc::WEXITSTATUS(status))
        }
    }

    #[test]
    fn seccomp_kill_mode_kills_a_call_outside_the_allow_list_and_log_mode_allows_it() {
        assert_eq!(
            child_with_filter(SeccompMode::Kill),
            (true, libc::SIGSYS),
            "socket(2) under the kill filter"
        );
        assert_eq!(
            child_with_filter(SeccompMode::Log),
            (false, 0),
            "socket(2) under the log filter"
        );
    }
}
