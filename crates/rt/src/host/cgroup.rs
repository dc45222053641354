//! The spill plane's cgroup: the "Elastic VM" that host CPU cores and memory are lent to.
//!
//! When the DPU spills flows to the host, the spill plane runs as a separate process confined
//! to a cgroup: a cpuset (which cores it may run on, so it cannot steal the tenant VMs' cores)
//! and a memory limit (so a runaway flow table is killed, not the host). Growing or shrinking
//! the spill plane means rewriting `cpuset.cpus`; tearing it down means killing every member
//! and removing the directories.
//!
//! Both cgroup versions are supported, because the machines we run on differ:
//! - **v2** (unified): one directory `<root>/spillway/<name>` with `cpuset.cpus`,
//!   `cpuset.mems` and `memory.max`; the `cpuset` and `memory` controllers are enabled in
//!   `cgroup.subtree_control` of the root and of `spillway` as needed. Used when a cgroup2
//!   mount offers both controllers.
//! - **v1**: two directories, `<cpuset mount>/spillway/<name>` and
//!   `<memory mount>/spillway/<name>`. A v1 cpuset must have `cpuset.cpus` and `cpuset.mems`
//!   written before it accepts tasks, and so must its parent, which is why `spillway` gets the
//!   root's values copied in.
//!
//! The shared `spillway` parent directory is created on demand and never removed: several
//! instances (and parallel tests) use it at once, and an empty directory costs nothing.
//!
//! Everything is direct reads and writes on the cgroup filesystem; each error names the path
//! and the value written.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Name of the directory under each hierarchy's root that holds all Spillway cgroups.
pub const PARENT_DIR: &str = "spillway";

/// How long [`Cgroup::kill_all`] waits for killed members to leave the cgroup.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long `rmdir` is retried while the kernel still reports the cgroup busy.
const RMDIR_WAIT: Duration = Duration::from_secs(2);
/// Poll interval for both waits.
const POLL: Duration = Duration::from_millis(10);
/// Largest CPU number accepted in a CPU list; far above any real machine, small enough that a
/// typo like "0-4000000000" cannot allocate gigabytes.
const CPU_MAX: u32 = 1 << 16;

/// Errors from cgroup operations. Each names the path involved and, for writes, the value.
#[derive(Debug, Error)]
pub enum CgroupError {
    /// No usable hierarchy: neither cgroup2 with cpuset+memory nor v1 cpuset and memory mounts.
    #[error("no usable cgroup hierarchy: {reason}")]
    NoHierarchy {
        /// What was looked at and missing.
        reason: String,
    },
    /// The cgroup name cannot be used as a single directory name.
    #[error("invalid cgroup name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A CPU or memory-node list does not parse.
    #[error("invalid CPU list {value:?}: {reason}")]
    CpuList {
        /// The list given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The cgroup directory already exists (a leftover from a crashed run, or a name clash).
    #[error("cgroup {path} already exists (recover the ledger of the run that created it)")]
    Exists {
        /// The existing directory.
        path: PathBuf,
    },
    /// Reading, creating or removing a file or directory failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done: "mkdir", "read", "rmdir", ...
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Writing a control file failed (the kernel rejects values it does not accept with
    /// `EINVAL`, a cpuset outside the parent's with `EINVAL` or `EPERM`).
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        /// The control file.
        path: PathBuf,
        /// The value written.
        value: String,
        /// The OS error.
        source: io::Error,
    },
    /// Members were still present when the bounded wait ran out.
    #[error("cgroup {path} still has members {pids:?} after {waited:?}")]
    Busy {
        /// The cgroup directory.
        path: PathBuf,
        /// The pids still listed.
        pids: Vec<u32>,
        /// How long we waited.
        waited: Duration,
    },
}

/// Which cgroup version a hierarchy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CgroupVersion {
    /// Legacy: one hierarchy per controller (here: cpuset and memory).
    V1,
    /// Unified: one hierarchy, controllers enabled per subtree.
    V2,
}

/// Where cgroups are created: the mount points found by [`Hierarchy::detect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v1 with separate (or co-mounted) cpuset and memory hierarchies.
    V1 {
        /// Mount point of the hierarchy with the `cpuset` controller.
        cpuset: PathBuf,
        /// Mount point of the hierarchy with the `memory` controller.
        memory: PathBuf,
    },
    /// cgroup v2 whose root offers the `cpuset` and `memory` controllers.
    V2 {
        /// Mount point of the unified hierarchy.
        root: PathBuf,
    },
}

impl Hierarchy {
    /// Finds the hierarchy to use from `/proc/self/mountinfo`: cgroup2 when a cgroup2 mount
    /// (`/sys/fs/cgroup` first) lists both `cpuset` and `memory` in `cgroup.controllers`,
    /// otherwise v1 mounts of `cpuset` and `memory`. A cgroup2 mount without those
    /// controllers (the "hybrid" layout, where v1 owns them) is ignored.
    pub fn detect() -> Result<Hierarchy, CgroupError> {
        let mountinfo =
            fs::read_to_string("/proc/self/mountinfo").map_err(|e| CgroupError::Io {
                op: "read",
                path: "/proc/self/mountinfo".into(),
                source: e,
            })?;
        Hierarchy::from_mountinfo(&mountinfo, |root| {
            fs::read_to_string(root.join("cgroup.controllers")).ok()
        })
    }

    /// [`Hierarchy::detect`] on given `mountinfo` text, with `controllers(root)` returning the
    /// contents of a cgroup2 root's `cgroup.controllers`. Separate so it can be tested.
    pub fn from_mountinfo(
        mountinfo: &str,
        controllers: impl Fn(&Path) -> Option<String>,
    ) -> Result<Hierarchy, CgroupError> {
        let mut v2 = Vec::new();
        let mut cpuset = None;
        let mut memory = None;
        for line in mountinfo.lines() {
            // Fields: id parent major:minor root mount-point options [optional...] - fstype
            // source super-options (proc(5)).
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = left.split(' ').nth(4) else {
                continue;
            };
            let mut right = right.split(' ');
            let (Some(fstype), Some(_source), Some(super_opts)) =
                (right.next(), right.next(), right.next())
            else {
                continue;
            };
            let mount_point = PathBuf::from(unescape_mountinfo(mount_point));
            match fstype {
                "cgroup2" => v2.push(mount_point),
                "cgroup" => {
                    let opts: Vec<&str> = super_opts.split(',').collect();
                    if opts.contains(&"cpuset") && cpuset.is_none() {
                        cpuset = Some(mount_point.clone());
                    }
                    if opts.contains(&"memory") && memory.is_none() {
                        memory = Some(mount_point);
                    }
                }
                _ => {}
            }
        }
        // The conventional mount point first; then others in mount order.
        v2.sort_by_key(|p| p != Path::new("/sys/fs/cgroup"));
        for root in &v2 {
            if let Some(c) = controllers(root) {
                let c: Vec<&str> = c.split_whitespace().collect();
                if c.contains(&"cpuset") && c.contains(&"memory") {
                    return Ok(Hierarchy::V2 { root: root.clone() });
                }
            }
        }
        match (cpuset, memory) {
            (Some(cpuset), Some(memory)) => Ok(Hierarchy::V1 { cpuset, memory }),
            (cpuset, memory) => Err(CgroupError::NoHierarchy {
                reason: format!(
                    "cgroup2 mounts {v2:?} lack cpuset+memory; v1 cpuset mount {cpuset:?}, \
                     v1 memory mount {memory:?}"
                ),
            }),
        }
    }

    /// The version of this hierarchy.
    pub fn version(&self) -> CgroupVersion {
        match self {
            Hierarchy::V1 { .. } => CgroupVersion::V1,
            Hierarchy::V2 { .. } => CgroupVersion::V2,
        }
    }

    /// The directories a cgroup called `name` has (or will have) in this hierarchy, cpuset
    /// first. Known before creation, so they can be recorded in a ledger first.
    pub fn dirs_for(&self, name: &str) -> Vec<PathBuf> {
        match self {
            Hierarchy::V1 { cpuset, memory } => {
                let mut dirs = vec![cpuset.join(PARENT_DIR).join(name)];
                // cpuset and memory may be co-mounted in one hierarchy: one directory then.
                if memory != cpuset {
                    dirs.push(memory.join(PARENT_DIR).join(name));
                }
                dirs
            }
            Hierarchy::V2 { root } => vec![root.join(PARENT_DIR).join(name)],
        }
    }
}

/// Mount points in mountinfo escape space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if let Some(&[b'\\', d0, d1, d2]) = b.get(i..i + 4) {
            let digits = [d0, d1, d2];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a [`Cgroup`] is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupSpec {
    /// CPUs the members may run on, as a cpuset list: `"1"`, `"0-1"`, `"0,2-3"`.
    pub cpus: String,
    /// Memory nodes, as a list like `cpus`; `"0"` on a machine without NUMA.
    #[serde(default = "default_mems")]
    pub mems: String,
    /// Memory limit in bytes (`memory.max` / `memory.limit_in_bytes`); `None` for no limit.
    /// v1 rounds it down to a page multiple.
    #[serde(default)]
    pub memory_max: Option<u64>,
}

fn default_mems() -> String {
    "0".to_owned()
}

impl CgroupSpec {
    /// A spec for `cpus`, memory node 0, no memory limit.
    pub fn new(cpus: impl Into<String>) -> CgroupSpec {
        CgroupSpec {
            cpus: cpus.into(),
            mems: default_mems(),
            memory_max: None,
        }
    }
}

impl Default for CgroupSpec {
    /// CPU 0, memory node 0, no memory limit: valid on every machine.
    fn default() -> Self {
        CgroupSpec::new("0")
    }
}

/// A cgroup (v1: a pair of cpuset + memory cgroups) holding the spill plane. Dropping it kills
/// any remaining members and removes its directories, best effort; [`Cgroup::remove`] does the
/// same with errors reported.
#[derive(Debug)]
pub struct Cgroup {
    name: String,
    version: CgroupVersion,
    /// Cpuset directory first; on v1 the memory directory second.
    dirs: Vec<PathBuf>,
    /// False once the directories are gone, so Drop does not try again.
    live: bool,
}

/// Moves processes into one cgroup, apart from the [`Cgroup`] (which stays with its owner).
#[derive(Clone, Debug)]
pub struct CgroupJoiner {
    procs: Vec<PathBuf>,
}

impl CgroupJoiner {
    /// Moves process `pid` (all its threads) into the cgroup, in every hierarchy.
    pub fn add_pid(&self, pid: u32) -> Result<(), CgroupError> {
        for f in &self.procs {
            write_value(f, &pid.to_string())?;
        }
        Ok(())
    }
}

impl Cgroup {
    /// Creates cgroup `name` in the detected hierarchy (see [`Hierarchy::detect`]) with the
    /// cpuset and memory limit of `spec`. Fails with [`CgroupError::Exists`] if it exists.
    pub fn create(name: &str, spec: &CgroupSpec) -> Result<Cgroup, CgroupError> {
        Cgroup::create_in(&Hierarchy::detect()?, name, spec)
    }

    /// Creates cgroup `name` in a given hierarchy. On failure nothing created is left behind
    /// (except the shared `spillway` parent).
    pub fn create_in(
        hierarchy: &Hierarchy,
        name: &str,
        spec: &CgroupSpec,
    ) -> Result<Cgroup, CgroupError> {
        validate_name(name)?;
        // Check the lists here so that a typo is reported as such, not as EINVAL from a write.
        for list in [&spec.cpus, &spec.mems] {
            if parse_cpu_list(list)?.is_empty() {
                return Err(CgroupError::CpuList {
                    value: list.clone(),
                    reason: "empty: a cpuset without CPUs or memory nodes cannot hold tasks",
                });
            }
        }
        // The shared parent may vanish anywhere between our mkdir of it and of our own
        // directory (its last other user removed it): the mkdir below it then finds nothing
        // (ENOENT), and a read or write of the files of a directory being removed fails with
        // ENODEV (kernfs). Start over (create_once removed what it made), a bounded number of
        // times.
        let mut attempt = 0;
        loop {
            match Cgroup::create_once(hierarchy, name, spec) {
                Err(CgroupError::Io { source, .. })
                    if (source.kind() == io::ErrorKind::NotFound
                        || source.raw_os_error() == Some(libc::ENODEV))
                        && attempt < 3 =>
                {
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    fn create_once(
        hierarchy: &Hierarchy,
        name: &str,
        spec: &CgroupSpec,
    ) -> Result<Cgroup, CgroupError> {
        // Directories are pushed as they are made, so an early return drops a Cgroup that
        // removes exactly those.
        let mut cg = Cgroup {
            name: name.to_owned(),
            version: hierarchy.version(),
            dirs: Vec::new(),
            live: true,
        };
        match hierarchy {
            Hierarchy::V1 { cpuset, memory } => {
                let cpuset_parent = cpuset.join(PARENT_DIR);
                mkdir_shared(&cpuset_parent)?;
                // A v1 cpuset starts with empty cpus/mems; tasks cannot enter it (nor can its
                // children be configured) until both are set. Copy the root's.
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let current = read_trimmed(&cpuset_parent.join(file))?;
                    if current.is_empty() {
                        let root_value = read_trimmed(&cpuset.join(file))?;
                        write_value(&cpuset_parent.join(file), &root_value)?;
                    }
                }
                let dir = cpuset_parent.join(name);
                mkdir_new(&dir)?;
                cg.dirs.push(dir.clone());
                write_value(&dir.join("cpuset.cpus"), &spec.cpus)?;
                write_value(&dir.join("cpuset.mems"), &spec.mems)?;

                if memory != cpuset {
                    let memory_parent = memory.join(PARENT_DIR);
                    mkdir_shared(&memory_parent)?;
                    let dir = memory_parent.join(name);
                    mkdir_new(&dir)?;
                    cg.dirs.push(dir);
                }
                if let Some(max) = spec.memory_max {
                    let dir = cg.dirs.last().expect("pushed above").clone();
                    write_value(&dir.join("memory.limit_in_bytes"), &max.to_string())?;
                }
            }
            Hierarchy::V2 { root } => {
                // Controllers flow down: each level must enable them for its children.
                enable_controllers(root)?;
                let parent = root.join(PARENT_DIR);
                mkdir_shared(&parent)?;
                enable_controllers(&parent)?;
                let dir = parent.join(name);
                mkdir_new(&dir)?;
                cg.dirs.push(dir.clone());
                write_value(&dir.join("cpuset.cpus"), &spec.cpus)?;
                write_value(&dir.join("cpuset.mems"), &spec.mems)?;
                let max = spec
                    .memory_max
                    .map_or_else(|| "max".to_owned(), |m| m.to_string());
                write_value(&dir.join("memory.max"), &max)?;
            }
        }
        Ok(cg)
    }

    /// The cgroup's name (its directory name under `spillway`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this cgroup lives in a v1 or a v2 hierarchy.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The cgroup's directories: the cpuset one first, on v1 the memory one second.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Moves process `pid` (all its threads) into the cgroup, in every hierarchy.
    pub fn add_pid(&self, pid: u32) -> Result<(), CgroupError> {
        self.joiner().add_pid(pid)
    }

    /// What [`Cgroup::add_pid`] needs, to be sent to another thread: moving a process into a
    /// v1 cpuset takes milliseconds (about 8 ms here), which a forwarding loop must not wait.
    pub fn joiner(&self) -> CgroupJoiner {
        CgroupJoiner {
            procs: self.dirs.iter().map(|d| d.join("cgroup.procs")).collect(),
        }
    }

    /// The member processes, sorted (on v1 the union over both hierarchies).
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let mut all = BTreeSet::new();
        for dir in &self.dirs {
            all.extend(read_procs(dir)?);
        }
        Ok(all.into_iter().collect())
    }

    /// The cpuset as the kernel reads it back (`cpuset.cpus`).
    pub fn cpus(&self) -> Result<String, CgroupError> {
        read_trimmed(&self.dirs[0].join("cpuset.cpus"))
    }

    /// Rewrites the cpuset: how the spill plane grows or shrinks onto more or fewer cores.
    pub fn set_cpus(&self, cpus: &str) -> Result<(), CgroupError> {
        parse_cpu_list(cpus)?;
        write_value(&self.dirs[0].join("cpuset.cpus"), cpus)
    }

    /// The memory limit as the kernel reads it back; `None` when unlimited.
    pub fn memory_max(&self) -> Result<Option<u64>, CgroupError> {
        let (path, raw) = match self.version {
            CgroupVersion::V1 => {
                let p = self.dirs.last().expect("a cgroup has a directory");
                let p = p.join("memory.limit_in_bytes");
                let raw = read_trimmed(&p)?;
                (p, raw)
            }
            CgroupVersion::V2 => {
                let p = self.dirs[0].join("memory.max");
                let raw = read_trimmed(&p)?;
                (p, raw)
            }
        };
        if raw == "max" {
            return Ok(None);
        }
        let v: u64 = raw.parse().map_err(|_| CgroupError::Io {
            op: "parse",
            path,
            source: io::Error::new(io::ErrorKind::InvalidData, format!("{raw:?}")),
        })?;
        // v1 reports "unlimited" as PAGE_COUNTER_MAX pages in bytes, just under 2^63.
        Ok((v < 1 << 62).then_some(v))
    }

    /// Sends SIGKILL to every member and waits (bounded) until the cgroup is empty.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            kill_members(dir)?;
        }
        Ok(())
    }

    /// Removes the cgroup's directories, retrying briefly while the kernel reports them busy
    /// (members that are still exiting). Does not kill: call [`Cgroup::kill_all`] first if the
    /// cgroup may still have members.
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.remove_dirs()
    }

    fn remove_dirs(&mut self) -> Result<(), CgroupError> {
        // Reverse creation order; each rmdir is idempotent, so a retry after a partial failure
        // picks up where this one stopped.
        for dir in self.dirs.iter().rev() {
            rmdir_retry(dir)?;
            remove_parent_if_unused(dir);
        }
        self.live = false;
        Ok(())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        if let Err(e) = self.kill_all() {
            tracing::warn!(cgroup = %self.name, error = %e, "killing cgroup members on drop");
        }
        if let Err(e) = self.remove_dirs() {
            tracing::warn!(cgroup = %self.name, error = %e, "removing cgroup on drop");
        }
    }
}

/// Removes one cgroup directory, as a ledger's cleanup does: kills its members (and those of
/// any child cgroups, which are removed first), waits for them to leave, and removes it.
/// Returns `false` if the directory did not exist (already cleaned up).
pub fn remove_dir(path: &Path) -> Result<bool, CgroupError> {
    if !path.exists() {
        return Ok(false);
    }
    let children = fs::read_dir(path).map_err(|e| CgroupError::Io {
        op: "read_dir",
        path: path.to_owned(),
        source: e,
    })?;
    for child in children.flatten() {
        if child.file_type().is_ok_and(|t| t.is_dir()) {
            remove_dir(&child.path())?;
        }
    }
    kill_members(path)?;
    rmdir_retry(path)?;
    remove_parent_if_unused(path);
    Ok(true)
}

/// Removes the shared `spillway` parent of `dir` if no other cgroup lives in it any more, so a
/// host is left as it was found. `rmdir` of a cgroup that still has children fails, which is
/// the answer for a parent another instance uses; a creator that loses the race retries.
fn remove_parent_if_unused(dir: &Path) {
    if let Some(parent) = dir.parent()
        && parent.file_name().is_some_and(|n| n == PARENT_DIR)
    {
        let _ = fs::remove_dir(parent);
    }
}

/// Parses a cpuset list (`"0-2,4"`, as in `cpuset.cpus`; a trailing newline is fine) into
/// sorted, distinct CPU numbers. An empty string gives an empty list. The kernel's
/// `a-b:stride/group` form is not accepted.
pub fn parse_cpu_list(list: &str) -> Result<Vec<u32>, CgroupError> {
    let err = |reason| CgroupError::CpuList {
        value: list.to_owned(),
        reason,
    };
    let trimmed = list.trim();
    let mut cpus = BTreeSet::new();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    for item in trimmed.split(',') {
        let item = item.trim();
        let num = |s: &str| -> Result<u32, CgroupError> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err("expected a number or a range a-b"));
            }
            let n: u32 = s.parse().map_err(|_| err("number out of range"))?;
            if n > CPU_MAX {
                return Err(err("CPU number above 65536"));
            }
            Ok(n)
        };
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(err("range start after its end"));
                }
                cpus.extend(a..=b);
            }
            None => {
                cpus.insert(num(item)?);
            }
        }
    }
    Ok(cpus.into_iter().collect())
}

fn validate_name(name: &str) -> Result<(), CgroupError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are not names")
    } else if name.contains('/') || name.contains('\0') || name.contains('\n') {
        Some("contains '/', NUL or newline")
    } else if name.len() > 255 {
        Some("longer than 255 bytes")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CgroupError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Enables the cpuset and memory controllers for the children of `dir` (v2), writing only
/// those not yet enabled so an unprivileged-but-delegated parent is not touched needlessly.
fn enable_controllers(dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let enabled = read_trimmed(&path)?;
    let enabled: Vec<&str> = enabled.split_whitespace().collect();
    for controller in ["cpuset", "memory"] {
        if !enabled.contains(&controller) {
            write_value(&path, &format!("+{controller}"))?;
        }
    }
    Ok(())
}

/// `mkdir` that tolerates the directory existing: for the shared parent, which parallel
/// creators may race to make.
fn mkdir_shared(dir: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(CgroupError::Io {
            op: "mkdir",
            path: dir.to_owned(),
            source: e,
        }),
    }
}

/// `mkdir` of a cgroup's own directory, which must not exist yet.
fn mkdir_new(dir: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(CgroupError::Exists {
            path: dir.to_owned(),
        }),
        Err(e) => Err(CgroupError::Io {
            op: "mkdir",
            path: dir.to_owned(),
            source: e,
        }),
    }
}

fn read_trimmed(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| CgroupError::Io {
            op: "read",
            path: path.to_owned(),
            source: e,
        })
}

/// Writes `value` to a control file in a single `write`, as cgroup files require; without
/// `O_CREAT` so a missing file (controller not enabled) is reported as such.
fn write_value(path: &Path, value: &str) -> Result<(), CgroupError> {
    let err = |source| CgroupError::Write {
        path: path.to_owned(),
        value: value.to_owned(),
        source,
    };
    let mut f = fs::OpenOptions::new().write(true).open(path).map_err(err)?;
    let n = f.write(value.as_bytes()).map_err(err)?;
    if n != value.len() {
        return Err(err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write: {n} of {} bytes", value.len()),
        )));
    }
    Ok(())
}

fn read_procs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    let path = dir.join("cgroup.procs");
    let text = fs::read_to_string(&path).map_err(|e| CgroupError::Io {
        op: "read",
        path: path.clone(),
        source: e,
    })?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// SIGKILLs every member of `dir` and waits until `cgroup.procs` is empty. Repeats the kill
/// each round, because a member may fork between our read and our kill. Never kills the
/// calling process, should it be a member: that is reported as [`CgroupError::Busy`].
fn kill_members(dir: &Path) -> Result<(), CgroupError> {
    let me = std::process::id();
    let start = Instant::now();
    // cgroup v2 (Linux 5.14+) kills the whole cgroup atomically, forks in flight included; the
    // loop below then only waits. Elsewhere the loop does the killing.
    let kill_file = dir.join("cgroup.kill");
    if kill_file.exists() && !read_procs(dir).is_ok_and(|p| p.contains(&me)) {
        let _ = write_value(&kill_file, "1");
    }
    loop {
        let pids = match read_procs(dir) {
            Ok(p) => p,
            // Gone already: nothing left to kill.
            Err(CgroupError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if pids.is_empty() {
            return Ok(());
        }
        if start.elapsed() >= KILL_WAIT || pids.contains(&me) {
            return Err(CgroupError::Busy {
                path: dir.to_owned(),
                pids,
                waited: start.elapsed(),
            });
        }
        for pid in pids {
            let Some(pid) = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            else {
                continue;
            };
            // ESRCH: it exited between the read and the kill, which is what we want anyway.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        thread::sleep(POLL);
    }
}

/// `rmdir` of a cgroup directory; `EBUSY` (members still exiting) is retried for a short
/// while, a missing directory is success.
fn rmdir_retry(dir: &Path) -> Result<(), CgroupError> {
    let start = Instant::now();
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < RMDIR_WAIT => {
                thread::sleep(POLL);
            }
            Err(e) => {
                return Err(CgroupError::Io {
                    op: "rmdir",
                    path: dir.to_owned(),
                    source: e,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_cpu_list_expands_ranges_sorted_and_distinct() {
        assert_eq!(parse_cpu_list("0-2,4").unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(parse_cpu_list("3,1,1-2\n").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_cpu_list(" 7 ").unwrap(), vec![7]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpu_list("\n").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn parse_cpu_list_rejects_malformed_lists() {
        for bad in [
            "a",
            "1-",
            "-1",
            "2-1",
            "1,,2",
            "0-3:2/4",
            "99999999999",
            "0-70000",
        ] {
            assert!(
                matches!(parse_cpu_list(bad), Err(CgroupError::CpuList { .. })),
                "{bad:?} should be rejected"
            );
        }
    }

    const MOUNTINFO_HYBRID: &str = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
36 33 0:31 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu
37 33 0:32 / /sys/fs/cgroup/cpuset rw,nosuid - cgroup cgroup rw,cpuset
38 33 0:33 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";

    #[test]
    fn detect_picks_v1_when_the_unified_mount_has_no_controllers() {
        let h = Hierarchy::from_mountinfo(MOUNTINFO_HYBRID, |_| Some(String::new())).unwrap();
        assert_eq!(
            h,
            Hierarchy::V1 {
                cpuset: "/sys/fs/cgroup/cpuset".into(),
                memory: "/sys/fs/cgroup/memory".into(),
            }
        );
        assert_eq!(
            h.dirs_for("x"),
            vec![
                PathBuf::from("/sys/fs/cgroup/cpuset/spillway/x"),
                PathBuf::from("/sys/fs/cgroup/memory/spillway/x"),
            ]
        );
    }

    #[test]
    fn detect_prefers_v2_with_cpuset_and_memory() {
        let info = "\
30 1 0:26 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw
31 1 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate
";
        let h = Hierarchy::from_mountinfo(info, |root| {
            Some(if root == Path::new("/mnt/my cg") {
                "cpuset cpu io memory pids\n".to_owned()
            } else {
                "cpu io pids\n".to_owned()
            })
        })
        .unwrap();
        assert_eq!(
            h,
            Hierarchy::V2 {
                root: "/mnt/my cg".into()
            }
        );
        assert_eq!(h.version(), CgroupVersion::V2);
        assert_eq!(
            h.dirs_for("x"),
            vec![PathBuf::from("/mnt/my cg/spillway/x")]
        );
    }

    #[test]
    fn detect_handles_co_mounted_v1_controllers() {
        let info = "40 1 0:40 / /cg/both rw - cgroup cgroup rw,cpuset,memory\n";
        let h = Hierarchy::from_mountinfo(info, |_| None).unwrap();
        assert_eq!(h.dirs_for("x"), vec![PathBuf::from("/cg/both/spillway/x")]);
    }

    #[test]
    fn detect_fails_without_controllers() {
        let info = "34 33 0:29 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let err = Hierarchy::from_mountinfo(info, |_| Some("cpu\n".into())).unwrap_err();
        assert!(matches!(err, CgroupError::NoHierarchy { .. }), "{err}");
    }

    #[test]
    fn invalid_names_and_specs_are_rejected_before_touching_the_filesystem() {
        let h = Hierarchy::V2 {
            root: "/nonexistent-cgroup-root".into(),
        };
        for bad in ["", ".", "..", "a/b"] {
            assert!(matches!(
                Cgroup::create_in(&h, bad, &CgroupSpec::default()),
                Err(CgroupError::InvalidName { .. })
            ));
        }
        assert!(matches!(
            Cgroup::create_in(&h, "ok", &CgroupSpec::new("")),
            Err(CgroupError::CpuList { .. })
        ));
        assert!(matches!(
            Cgroup::create_in(&h, "ok", &CgroupSpec::new("0-x")),
            Err(CgroupError::CpuList { .. })
        ));
    }

    #[test]
    fn unescape_mountinfo_decodes_octal_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/trail\\04"), "/trail\\04");
    }
}
