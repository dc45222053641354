//! The cleanup [`Ledger`]: the crash-safe record of everything a testbed creates.
//!
//! The [`Ledger`] is what makes a testbed leave nothing behind, even when the process crashes:
//! every object is recorded (appended and fsynced) *before* it is created, so after a crash the
//! next run's [`Ledger::recover`] finds and removes whatever may exist. Removal tolerates
//! objects that were never created or are already gone.
//!
//! Trust: the ledger file tells root what to delete and whom to kill, so it is only believed
//! when nobody else could have written it, and then only within what this program could have
//! created. [`secure_state_dir`] creates the state directory (mode 0755, ours) or refuses one
//! that is not a real directory owned by us and closed to group and other writes (its
//! ancestors too, unless sticky, as `/tmp` is). [`Ledger::recover`] opens the ledger with
//! `O_NOFOLLOW` and refuses a file that is not ours, not regular or writable by group or
//! others; then it checks every entry against a [`LedgerScope`] (namespace, link and cgroup
//! names with the instance's prefix, files inside the state directory, processes whose start
//! time *and* executable match and whose executable is one we start) before it removes
//! anything. One foreign or corrupt entry fails the whole recovery, which then touches nothing.
//!
//! Over 1,000 lines only with its tests (about 300), which attack exactly the rules above:
//! foreign names, reused pids, replaced executables, corrupt entries. They stay beside the rules
//! they check.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Write as _};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::cgroup::{self, Cgroup, CgroupError, CgroupSpec, Hierarchy};
use super::netns::{
    NetnsError, check_link_name, check_netns_name, cmd_line, link_del, link_exists, link_set_netns,
    netns_add, netns_del, netns_exists, veth_add,
};

/// One object a testbed created, as recorded in a [`Ledger`] (one JSON object per line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerEntry {
    /// A named network namespace.
    Netns(String),
    /// A link (veth, persistent TAP, ...) in namespace `ns` (`None`: the root namespace).
    Link {
        /// Interface name.
        name: String,
        /// Namespace it lives in, if not the root one.
        ns: Option<String>,
    },
    /// One cgroup directory (a v1 cgroup has two entries, cpuset and memory).
    Cgroup(PathBuf),
    /// A process, identified by pid *and* start time, so that a recycled pid is never killed.
    Pid {
        /// Process id.
        pid: u32,
        /// Start time in clock ticks since boot, field 22 of `/proc/<pid>/stat`.
        start_time_ticks: u64,
        /// Its executable as `/proc/<pid>/exe` named it when recorded. Recovery kills only a
        /// process whose executable still is this one (and one the [`LedgerScope`] allows).
        /// Absent in ledgers of older versions, which recovery therefore refuses.
        #[serde(default)]
        exe: Option<PathBuf>,
    },
    /// A file (socket, pid file, shared-memory backing file, ...).
    File(PathBuf),
    /// A binary the run started processes from besides its own (`spillway ctl upgrade
    /// --binary`), recorded before the first of them: recovery allows a recorded process
    /// running it, if it still is a [`trusted_executable`] then. Nothing to remove.
    Exe(PathBuf),
}

impl LedgerEntry {
    /// An entry for running process `pid`, with its start time read from /proc.
    pub fn pid(pid: u32) -> io::Result<LedgerEntry> {
        Ok(LedgerEntry::Pid {
            pid,
            start_time_ticks: proc_start_time(pid)?.0,
            exe: Some(proc_exe(pid)?),
        })
    }
}

/// Errors from the ledger itself (commands it runs report their own errors inside).
#[derive(Debug, Error)]
pub enum LedgerError {
    /// The instance name cannot be a file name.
    #[error("invalid ledger instance {instance:?}: {reason}")]
    InvalidInstance {
        /// The instance name given.
        instance: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A ledger from an earlier run exists: its objects may still exist too.
    #[error("ledger {path} from an earlier run exists: call Ledger::recover first")]
    Stale {
        /// The ledger file.
        path: PathBuf,
    },
    /// Another live process holds this ledger.
    #[error("ledger {path} is in use by a running process")]
    InUse {
        /// The ledger file.
        path: PathBuf,
    },
    /// The state directory, one of its parents, or the ledger file could have been written by
    /// someone else: nothing in it is believed.
    #[error("{path}: found {found}, expected {expected}; refusing to trust it")]
    Unsafe {
        /// The directory or file.
        path: PathBuf,
        /// What it is: type, owner and mode.
        found: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A ledger line that is not a ledger entry (a torn *last* line, from a crash mid-write,
    /// is not this: it is skipped and counted).
    #[error("ledger {path} line {line} is not a ledger entry: {text:?}; nothing was removed")]
    Corrupt {
        /// The ledger file.
        path: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// The line (at most 200 bytes of it).
        text: String,
    },
    /// A ledger entry names something this program could not have created.
    #[error(
        "ledger {path} line {line}: {entry} is outside this testbed ({reason}); nothing was removed"
    )]
    Foreign {
        /// The ledger file.
        path: PathBuf,
        /// Line number, from 1.
        line: usize,
        /// The entry, as JSON.
        entry: String,
        /// Why it is out of scope.
        reason: String,
    },
    /// Reading or writing the ledger file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A namespace or link command failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A cgroup operation failed.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// Spawning a recorded process failed.
    #[error("spawning `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// The OS error.
        source: io::Error,
    },
}

/// What [`Ledger::cleanup`] did, entry by entry.
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// Entries whose object existed and was removed.
    pub removed: Vec<LedgerEntry>,
    /// Entries whose object did not exist (never created, or removed by someone else).
    pub already_gone: Vec<LedgerEntry>,
    /// Entries whose removal failed, with the reason. The ledger file is kept when any did.
    pub failed: Vec<(LedgerEntry, String)>,
    /// Lines of the ledger file that did not parse (a line torn by a crash mid-write).
    pub unparsed_lines: usize,
    /// Whether the ledger file was deleted.
    pub ledger_removed: bool,
}

impl CleanupReport {
    /// True when nothing failed.
    pub fn is_clean(&self) -> bool {
        self.failed.is_empty()
    }
}

/// A crash-safe record of everything a testbed instance creates, kept in
/// `<dir>/<instance>.ledger` as JSON lines, held under an exclusive `flock` while the instance
/// runs (so [`Ledger::recover`] never tears down a live instance).
///
/// Protocol: [`Ledger::record`] an object *before* creating it (the helpers such as
/// [`Ledger::netns_add`] do both); at the end [`Ledger::cleanup`] (or drop) removes everything
/// in reverse order. If the process dies, the file stays; the next run calls
/// [`Ledger::recover`] first. Processes are one exception to record-first, as a pid exists
/// only after the spawn: [`Ledger::spawn`] records right after, and a process started inside a
/// recorded cgroup or namespace is covered by that entry during the gap. Files at paths that
/// someone else may hold (sockets) are the other: they are recorded only once this process
/// created them, so that a failed start never removes what it did not make; a crash in that gap
/// leaves a stale socket, which the next start finds unanswered and replaces.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    file: File,
    entries: Vec<LedgerEntry>,
    /// True once cleaned up or leaked: Drop then does nothing.
    done: bool,
}

impl Ledger {
    /// Where ledgers live by default: a tmpfs, so a reboot (which removes every object too)
    /// also removes the ledgers.
    pub const DEFAULT_DIR: &'static str = "/run/spillway";

    /// [`Ledger::DEFAULT_DIR`] as a path.
    pub fn default_dir() -> &'static Path {
        Path::new(Self::DEFAULT_DIR)
    }

    /// The ledger file of `instance` in `dir`.
    pub fn path_for(dir: &Path, instance: &str) -> PathBuf {
        dir.join(format!("{instance}.ledger"))
    }

    /// Starts a new, empty ledger for `instance` in `dir` (created if missing, see
    /// [`secure_state_dir`]; an unsafe one is refused). Fails with [`LedgerError::Stale`] if a
    /// ledger exists: recover it first.
    pub fn open(dir: &Path, instance: &str) -> Result<Ledger, LedgerError> {
        check_instance(instance)?;
        let io_err = |op, path: &Path| {
            let path = path.to_owned();
            move |source| LedgerError::Io { op, path, source }
        };
        secure_state_dir(dir)?;
        let path = Self::path_for(dir, instance);
        // Create and lock under a private name, then link it into place: the ledger never
        // appears unlocked, so a concurrent recover cannot mistake it for a dead run's.
        let tmp = dir.join(format!(".{instance}.ledger.{}.tmp", std::process::id()));
        // A leftover with our pid can only be from a dead process that had the same pid.
        let _ = fs::remove_file(&tmp);
        // 0600 whatever the umask (a umask only takes bits away): only we read or write it.
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        let locked = rustix::fs::flock(
            file.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        );
        let linked = locked
            .map_err(io::Error::from)
            .and_then(|()| fs::hard_link(&tmp, &path));
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(LedgerError::Stale { path });
            }
            Err(e) => return Err(io_err("link", &path)(e)),
        }
        // Make the new directory entry durable too, not just the file's contents.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err("fsync", dir))?;
        Ok(Ledger {
            path,
            file,
            entries: Vec::new(),
            done: false,
        })
    }

    /// Cleans up after a previous run of `instance` that did not (it crashed or was killed):
    /// removes every recorded object and the ledger. `Ok(None)` when there is no ledger.
    /// Fails with [`LedgerError::InUse`] if that run is still alive. What it may remove is
    /// [`LedgerScope::new`]`(dir, instance)`; see [`Ledger::recover_in`].
    pub fn recover(dir: &Path, instance: &str) -> Result<Option<CleanupReport>, LedgerError> {
        Self::recover_in(dir, instance, &LedgerScope::new(dir, instance))
    }

    /// [`Ledger::recover`] within `scope`. The state directory and the ledger file must be safe
    /// (ours, not a symlink, not writable by group or others: [`LedgerError::Unsafe`]); every
    /// entry must be inside `scope` ([`LedgerError::Foreign`]) and every line but a torn last
    /// one must parse ([`LedgerError::Corrupt`]). All of it is checked before anything is
    /// removed: a refused ledger is left as it is, for an operator to look at.
    ///
    /// A torn last line (no newline at its end: [`Ledger::record`] writes each line, newline
    /// included, in one `write`, so only a crash mid-write leaves one) is skipped and counted in
    /// [`CleanupReport::unparsed_lines`]: the object it was about to record was not created
    /// yet, because recording comes first.
    pub fn recover_in(
        dir: &Path,
        instance: &str,
        scope: &LedgerScope,
    ) -> Result<Option<CleanupReport>, LedgerError> {
        check_instance(instance)?;
        let path = Self::path_for(dir, instance);
        if !dir.exists() {
            return Ok(None);
        }
        secure_state_dir(dir)?;
        let file = match OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            // O_NOFOLLOW on a symlink fails with ELOOP.
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(LedgerError::Unsafe {
                    path,
                    found: "a symbolic link".into(),
                    expected: "a regular file owned by us",
                });
            }
            Err(source) => {
                return Err(LedgerError::Io {
                    op: "open",
                    path,
                    source,
                });
            }
        };
        let meta = file.metadata().map_err(|source| LedgerError::Io {
            op: "fstat",
            path: path.clone(),
            source,
        })?;
        check_owned(&path, &meta, false)?;
        match rustix::fs::flock(
            file.as_fd(),
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(LedgerError::InUse { path }),
            Err(e) => {
                return Err(LedgerError::Io {
                    op: "flock",
                    path,
                    source: e.into(),
                });
            }
        }
        // The owner may have finished its cleanup (unlinking the file) between our open and
        // our lock; then the locked inode is no longer the ledger and there is nothing to do.
        let same_file = match fs::symlink_metadata(&path) {
            Ok(b) => meta.ino() == b.ino() && meta.dev() == b.dev(),
            _ => false,
        };
        if !same_file {
            return Ok(None);
        }
        let mut text = String::new();
        io::Read::read_to_string(&mut BufReader::new(&file), &mut text).map_err(|source| {
            LedgerError::Io {
                op: "read",
                path: path.clone(),
                source,
            }
        })?;
        let (entries, unparsed) = parse_ledger(&path, &text, scope)?;
        let mut ledger = Ledger {
            path,
            file,
            entries,
            done: false,
        };
        let mut report = ledger.cleanup();
        report.unparsed_lines = unparsed;
        Ok(Some(report))
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Everything recorded so far, oldest first.
    pub fn entries(&self) -> &[LedgerEntry] {
        &self.entries
    }

    /// Appends `entry` to the file and fsyncs it. Call before creating the object.
    pub fn record(&mut self, entry: LedgerEntry) -> Result<(), LedgerError> {
        let mut line = serde_json::to_string(&entry).expect("ledger entries always serialize");
        line.push('\n');
        // One write of a whole line with O_APPEND: a crash leaves at worst a torn last line,
        // which recover skips (and counts).
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|source| LedgerError::Io {
                op: "append",
                path: self.path.clone(),
                source,
            })?;
        self.entries.push(entry);
        Ok(())
    }

    /// Records and creates network namespace `name`.
    pub fn netns_add(&mut self, name: &str) -> Result<(), LedgerError> {
        self.record(LedgerEntry::Netns(name.to_owned()))?;
        Ok(netns_add(name)?)
    }

    /// Records both ends and creates veth pair `a` <-> `b` in the root namespace.
    pub fn veth_add(&mut self, a: &str, b: &str) -> Result<(), LedgerError> {
        for end in [a, b] {
            self.record(LedgerEntry::Link {
                name: end.to_owned(),
                ns: None,
            })?;
        }
        Ok(veth_add(a, b)?)
    }

    /// Records the link's new home and moves `link` into namespace `ns`.
    pub fn link_set_netns(&mut self, link: &str, ns: &str) -> Result<(), LedgerError> {
        self.record(LedgerEntry::Link {
            name: link.to_owned(),
            ns: Some(ns.to_owned()),
        })?;
        Ok(link_set_netns(link, ns)?)
    }

    /// Creates listening socket `path` (mode 0600, owned by `owner` if given, whatever the
    /// umask) and then records it: a file goes into the ledger only once this process created
    /// it, so a failed start never removes somebody else's. A stale socket of a crashed run is
    /// replaced; any other file at `path` is an error and left alone.
    pub fn bind_socket(
        &mut self,
        path: &Path,
        owner: Option<u32>,
    ) -> Result<std::os::unix::net::UnixListener, LedgerError> {
        let io = |op, source| LedgerError::Io {
            op,
            path: path.to_owned(),
            source,
        };
        crate::host::unixsock::remove_stale(path).map_err(|e| io("replace the stale socket", e))?;
        let listener =
            crate::host::unixsock::bind(path, 0o600, owner).map_err(|e| io("bind", e))?;
        if let Err(e) = self.record(LedgerEntry::File(path.to_owned())) {
            drop(listener);
            let _ = fs::remove_file(path);
            return Err(e);
        }
        Ok(listener)
    }

    /// Records the cgroup's directories and creates it in the detected hierarchy.
    pub fn create_cgroup(&mut self, name: &str, spec: &CgroupSpec) -> Result<Cgroup, LedgerError> {
        let hierarchy = Hierarchy::detect()?;
        for dir in hierarchy.dirs_for(name) {
            self.record(LedgerEntry::Cgroup(dir))?;
        }
        Ok(Cgroup::create_in(&hierarchy, name, spec)?)
    }

    /// Spawns `cmd` and records the child (see the type's doc for the window between the two).
    /// If recording fails the child is killed, so nothing unrecorded survives.
    pub fn spawn(&mut self, cmd: &mut Command) -> Result<Child, LedgerError> {
        let mut child = cmd.spawn().map_err(|source| LedgerError::Spawn {
            cmd: cmd_line(cmd),
            source,
        })?;
        let recorded = LedgerEntry::pid(child.id())
            .map_err(|source| LedgerError::Io {
                op: "read start time of",
                path: format!("/proc/{}/stat", child.id()).into(),
                source,
            })
            .and_then(|entry| self.record(entry));
        if let Err(e) = recorded {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(child)
    }

    /// Removes every recorded object, newest first, tolerating those already gone, then
    /// deletes the ledger file. If some removal fails the file is kept (and the failed entries
    /// stay in memory) so a later cleanup or recover can retry.
    pub fn cleanup(&mut self) -> CleanupReport {
        let mut report = CleanupReport::default();
        let mut failed = Vec::new();
        for entry in self.entries.drain(..).rev() {
            match remove_entry(&entry) {
                Ok(true) => report.removed.push(entry),
                Ok(false) => report.already_gone.push(entry),
                Err(reason) => {
                    report.failed.push((entry.clone(), reason));
                    failed.push(entry);
                }
            }
        }
        if failed.is_empty() {
            match fs::remove_file(&self.path) {
                Ok(()) => report.ledger_removed = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => report.ledger_removed = true,
                Err(e) => report.failed.push((
                    LedgerEntry::File(self.path.clone()),
                    format!("removing the ledger: {e}"),
                )),
            }
            self.done = report.ledger_removed;
        } else {
            failed.reverse();
            self.entries = failed;
        }
        report
    }

    /// Gives up the ledger without cleaning up, as a crash would: the file and every recorded
    /// object stay for [`Ledger::recover`]. For tests of recovery, and for handing a testbed
    /// over to another process.
    pub fn leak(mut self) {
        self.done = true;
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let report = self.cleanup();
        for (entry, reason) in &report.failed {
            let ledger = self.path.display();
            tracing::warn!(%ledger, ?entry, %reason, "cleanup on drop failed");
        }
    }
}

// ---- Trust: the state directory, the ledger file, the scope of an entry ----------------------

/// Mode of a state directory this program creates: other users may look up a VM's port
/// socket in it (each socket has its own mode and owner), nobody but us may add, rename or
/// remove entries.
pub const STATE_DIR_MODE: u32 = 0o755;

fn describe(meta: &fs::Metadata) -> String {
    let ft = meta.file_type();
    let kind = if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "a special file"
    };
    format!(
        "{kind} owned by uid {} with mode {:04o}",
        meta.uid(),
        meta.mode() & 0o7777
    )
}

/// Checks that `meta` (of `path`, from `lstat` or `fstat`) is ours and closed to writes by
/// group and others, and a directory (`dir`) or a regular file.
fn check_owned(path: &Path, meta: &fs::Metadata, dir: bool) -> Result<(), LedgerError> {
    let euid = rustix::process::geteuid().as_raw();
    let kind_ok = if dir {
        meta.file_type().is_dir()
    } else {
        meta.file_type().is_file()
    };
    if kind_ok && meta.uid() == euid && meta.mode() & 0o022 == 0 {
        return Ok(());
    }
    Err(LedgerError::Unsafe {
        path: path.to_owned(),
        found: describe(meta),
        expected: if dir {
            "a directory (not a symbolic link) owned by us, not writable by group or others"
        } else {
            "a regular file (not a symbolic link) owned by us, not writable by group or others"
        },
    })
}

/// Creates the state directory `dir` (mode [`STATE_DIR_MODE`] whatever the umask, with any
/// missing parents) or checks the existing one, like a daemon's run directory: it must be a
/// directory, not a symbolic link, owned by our effective uid and not writable by group or
/// others; each of its ancestors must be owned by root or us and, if writable by group or
/// others, sticky (as `/tmp` is), so nobody can swap the directory for another. The error
/// names the path, what was found and what is expected.
pub fn secure_state_dir(dir: &Path) -> Result<(), LedgerError> {
    let io_err = |op, path: &Path| {
        let path = path.to_owned();
        move |source| LedgerError::Io { op, path, source }
    };
    match fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
            fs::DirBuilder::new()
                .recursive(true)
                .mode(STATE_DIR_MODE)
                .create(dir)
                .map_err(io_err("create_dir_all", dir))?;
            // The umask may have taken bits away (0700 would lock non-root VM endpoints out).
            fs::set_permissions(dir, fs::Permissions::from_mode(STATE_DIR_MODE))
                .map_err(io_err("chmod", dir))?;
        }
        Err(e) => return Err(io_err("lstat", dir)(e)),
    }
    let meta = fs::symlink_metadata(dir).map_err(io_err("lstat", dir))?;
    check_owned(dir, &meta, true)?;
    let canonical = fs::canonicalize(dir).map_err(io_err("canonicalize", dir))?;
    check_ancestors(
        &canonical,
        "a parent of the state directory owned by root or us, and not writable by group or \
         others unless sticky",
    )
}

/// Checks that no one but root and us can swap `canonical` (a canonical path) for another
/// file: each of its ancestors must be owned by root or us and, if writable by group or others,
/// sticky (as `/tmp` is). `expected` is the error's description of a good ancestor.
fn check_ancestors(canonical: &Path, expected: &'static str) -> Result<(), LedgerError> {
    let euid = rustix::process::geteuid().as_raw();
    for parent in canonical.ancestors().skip(1) {
        let meta = fs::symlink_metadata(parent).map_err(|source| LedgerError::Io {
            op: "lstat",
            path: parent.to_owned(),
            source,
        })?;
        let sticky = meta.mode() & 0o1000 != 0;
        let owner_ok = meta.uid() == 0 || meta.uid() == euid;
        if !owner_ok || (meta.mode() & 0o022 != 0 && !sticky) {
            return Err(LedgerError::Unsafe {
                path: parent.to_owned(),
                found: describe(&meta),
                expected,
            });
        }
    }
    Ok(())
}

/// Checks a binary an operator asks a root process to run (`spillway ctl upgrade --binary`):
/// an absolute path to a regular file with an execute bit, owned by root or us and not
/// writable by group or others, in directories nobody else can swap it in (see
/// `check_ancestors`). Returns its canonical path, which is what runs: a symbolic link
/// followed now cannot be pointed elsewhere later.
pub fn trusted_executable(path: &Path) -> Result<PathBuf, LedgerError> {
    if !path.is_absolute() {
        return Err(LedgerError::Unsafe {
            path: path.to_owned(),
            found: "a relative path".into(),
            expected: "an absolute path",
        });
    }
    let canonical = fs::canonicalize(path).map_err(|source| LedgerError::Io {
        op: "canonicalize",
        path: path.to_owned(),
        source,
    })?;
    let meta = fs::symlink_metadata(&canonical).map_err(|source| LedgerError::Io {
        op: "lstat",
        path: canonical.clone(),
        source,
    })?;
    let euid = rustix::process::geteuid().as_raw();
    let owner_ok = meta.uid() == 0 || meta.uid() == euid;
    if !meta.file_type().is_file()
        || !owner_ok
        || meta.mode() & 0o022 != 0
        || meta.mode() & 0o111 == 0
    {
        return Err(LedgerError::Unsafe {
            path: canonical,
            found: describe(&meta),
            expected: "an executable regular file owned by root or us, not writable by group or others",
        });
    }
    check_ancestors(
        &canonical,
        "a directory above the binary owned by root or us, and not writable by group or \
         others unless sticky",
    )?;
    Ok(canonical)
}

/// What a recovered ledger may undo: the objects this program could have created for one
/// testbed instance. Built by [`LedgerScope::new`]; a caller that names objects explicitly
/// (a testbed's own namespace names) adds them.
#[derive(Clone, Debug)]
pub struct LedgerScope {
    /// The state directory, canonical: files must be directly inside it.
    dir: PathBuf,
    /// Namespace, link and cgroup names must start with this (the instance name).
    prefix: String,
    /// Namespace names allowed besides the prefixed ones.
    netns: Vec<String>,
    /// Link names allowed besides the prefixed ones.
    links: Vec<String>,
    /// Directories a recorded cgroup may be a child of (`<mount>/spillway` of each controller).
    cgroup_parents: Vec<PathBuf>,
    /// Executables a recorded process may run.
    exes: Vec<PathBuf>,
}

impl LedgerScope {
    /// The scope of `instance` in state directory `dir`: namespaces, links and cgroups whose
    /// names start with `instance`, cgroups in our own parent of the detected hierarchy, files
    /// directly in `dir`, processes running this executable.
    pub fn new(dir: &Path, instance: &str) -> LedgerScope {
        let cgroup_parents = Hierarchy::detect()
            .map(|h| {
                h.dirs_for("x")
                    .iter()
                    .filter_map(|d| d.parent().map(Path::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        LedgerScope {
            dir: fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned()),
            prefix: instance.to_owned(),
            netns: Vec::new(),
            links: Vec::new(),
            cgroup_parents,
            exes: std::env::current_exe().into_iter().collect(),
        }
    }

    /// Also allows namespace `name` (one the configuration names explicitly).
    pub fn allow_netns(mut self, name: &str) -> Self {
        self.netns.push(name.to_owned());
        self
    }

    /// Also allows link `name`.
    pub fn allow_link(mut self, name: &str) -> Self {
        self.links.push(name.to_owned());
        self
    }

    /// Also allows processes running `exe` (canonicalised; e.g. the spill plane's binary).
    pub fn allow_exe(mut self, exe: &Path) -> Self {
        self.exes
            .push(fs::canonicalize(exe).unwrap_or_else(|_| exe.to_owned()));
        self
    }

    fn prefixed(&self, name: &str) -> bool {
        name.strip_prefix(&self.prefix)
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(['/', '.']))
    }

    /// `Ok` if `entry` is something this testbed could have created; else why not.
    pub fn check(&self, entry: &LedgerEntry) -> Result<(), String> {
        let plain = |p: &Path| {
            p.is_absolute()
                && p.components().all(|c| {
                    matches!(
                        c,
                        std::path::Component::RootDir | std::path::Component::Normal(_)
                    )
                })
        };
        match entry {
            LedgerEntry::Netns(name) => {
                check_netns_name(name).map_err(|e| e.to_string())?;
                if self.prefixed(name) || self.netns.contains(name) {
                    Ok(())
                } else {
                    Err(format!(
                        "namespace name without the prefix {:?}",
                        self.prefix
                    ))
                }
            }
            LedgerEntry::Link { name, ns } => {
                check_link_name(name).map_err(|e| e.to_string())?;
                if let Some(ns) = ns {
                    self.check(&LedgerEntry::Netns(ns.clone()))?;
                }
                if self.prefixed(name) || self.links.contains(name) {
                    Ok(())
                } else {
                    Err(format!("link name without the prefix {:?}", self.prefix))
                }
            }
            LedgerEntry::Cgroup(path) => {
                if !plain(path) {
                    return Err("not an absolute path without '.' or '..'".into());
                }
                let named = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| self.prefixed(n));
                let placed = path
                    .parent()
                    .is_some_and(|p| self.cgroup_parents.iter().any(|c| c == p));
                if !named || !placed {
                    return Err(format!(
                        "not a cgroup {:?}* directly under {:?}",
                        self.prefix, self.cgroup_parents
                    ));
                }
                // No symlink may lead the removal elsewhere.
                match fs::canonicalize(path) {
                    Ok(c) if &c != path => Err(format!("resolves to {}", c.display())),
                    _ => Ok(()),
                }
            }
            LedgerEntry::File(path) => {
                if !plain(path) {
                    return Err("not an absolute path without '.' or '..'".into());
                }
                let parent = path
                    .parent()
                    .map(|p| fs::canonicalize(p).unwrap_or_else(|_| p.to_owned()));
                if parent.as_deref() != Some(self.dir.as_path()) {
                    return Err(format!(
                        "not directly in the state directory {}",
                        self.dir.display()
                    ));
                }
                Ok(())
            }
            LedgerEntry::Exe(path) => {
                if !plain(path) {
                    return Err("not an absolute path without '.' or '..'".into());
                }
                trusted_executable(path)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            LedgerEntry::Pid { exe, .. } => match exe {
                None => Err("no executable recorded (a ledger of an older version?)".into()),
                Some(exe) if self.exes.iter().any(|e| e == exe) => Ok(()),
                Some(exe) => Err(format!(
                    "executable {} is none this program starts ({:?})",
                    exe.display(),
                    self.exes
                )),
            },
        }
    }
}

/// The entries of a ledger's text and the number of torn lines skipped (0 or 1), or the first
/// corrupt or foreign line.
fn parse_ledger(
    path: &Path,
    text: &str,
    scope: &LedgerScope,
) -> Result<(Vec<LedgerEntry>, usize), LedgerError> {
    let mut entries = Vec::new();
    let mut torn = 0;
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.split_terminator('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let entry: LedgerEntry = match serde_json::from_str(line) {
            Ok(e) => e,
            Err(_) if i + 1 == lines.len() && !complete => {
                torn += 1;
                continue;
            }
            Err(_) => {
                let mut end = line.len().min(200);
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                return Err(LedgerError::Corrupt {
                    path: path.to_owned(),
                    line: i + 1,
                    text: line[..end].to_owned(),
                });
            }
        };
        entries.push((i + 1, entry));
    }
    // The binaries the run recorded (an upgrade's): a process running one is ours too.
    let mut scope = scope.clone();
    for (_, e) in &entries {
        if let LedgerEntry::Exe(exe) = e {
            scope = scope.allow_exe(exe);
        }
    }
    for (line, entry) in &entries {
        if let Err(reason) = scope.check(entry) {
            return Err(LedgerError::Foreign {
                path: path.to_owned(),
                line: *line,
                entry: serde_json::to_string(entry).expect("ledger entries always serialize"),
                reason,
            });
        }
    }
    Ok((entries.into_iter().map(|(_, e)| e).collect(), torn))
}

fn check_instance(instance: &str) -> Result<(), LedgerError> {
    let reason = if instance.is_empty() || instance.starts_with('.') {
        Some("empty or starting with '.'")
    } else if instance.contains(|c: char| c == '/' || c == '\0' || c.is_whitespace()) {
        Some("contains '/', NUL or whitespace")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(LedgerError::InvalidInstance {
            instance: instance.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Removes one object; `Ok(false)` if it did not exist. The error is a message, for the report.
fn remove_entry(entry: &LedgerEntry) -> Result<bool, String> {
    match entry {
        LedgerEntry::Netns(name) => {
            if !netns_exists(name).map_err(|e| e.to_string())? {
                return Ok(false);
            }
            match netns_del(name) {
                Ok(()) => Ok(true),
                // Someone else deleted it between our check and our delete: still gone.
                Err(e) => match netns_exists(name) {
                    Ok(false) => Ok(false),
                    _ => Err(e.to_string()),
                },
            }
        }
        LedgerEntry::Link { name, ns } => {
            let ns = ns.as_deref();
            if !link_exists(name, ns).map_err(|e| e.to_string())? {
                return Ok(false);
            }
            match link_del(name, ns) {
                Ok(()) => Ok(true),
                // Deleting a veth end deletes its peer too, and a namespace going away takes
                // its links: both race with us harmlessly.
                Err(e) => match link_exists(name, ns) {
                    Ok(false) => Ok(false),
                    _ => Err(e.to_string()),
                },
            }
        }
        LedgerEntry::Cgroup(path) => cgroup::remove_dir(path).map_err(|e| e.to_string()),
        LedgerEntry::Pid {
            pid,
            start_time_ticks,
            exe,
        } => kill_recorded(*pid, *start_time_ticks, exe.as_deref()),
        LedgerEntry::File(path) => match fs::remove_file(path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(format!("removing {}: {e}", path.display())),
        },
        // A note for recovery, not an object.
        LedgerEntry::Exe(_) => Ok(false),
    }
}

/// Start time (clock ticks since boot) and state letter of a process, from `/proc/<pid>/stat`.
fn proc_start_time(pid: u32) -> io::Result<(u64, char)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected /proc/{pid}/stat: {stat:?}"),
        )
    })
}

/// Parses state (field 3) and starttime (field 22) from a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may itself contain spaces and parentheses, so fields
/// are counted from the last ')'.
fn parse_stat(stat: &str) -> Option<(u64, char)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3; starttime is field 22, 19 further on.
    let start = fields.nth(18)?.parse().ok()?;
    Some((start, state))
}

/// The executable of process `pid` (`/proc/<pid>/exe`), without the " (deleted)" the kernel
/// appends once the file was replaced (a rebuilt binary is still the same program here).
fn proc_exe(pid: u32) -> io::Result<PathBuf> {
    let exe = fs::read_link(format!("/proc/{pid}/exe"))?;
    let s = exe.as_os_str().as_encoded_bytes();
    match s.strip_suffix(b" (deleted)") {
        Some(stem) => Ok(PathBuf::from(std::ffi::OsStr::from_bytes(stem))),
        None => Ok(exe),
    }
}

/// Kills a recorded process if it is still the same one (same start time and, when recorded,
/// same executable); `Ok(false)` when it is gone, already a zombie, or the pid now belongs to
/// another process.
fn kill_recorded(pid: u32, start_time_ticks: u64, exe: Option<&Path>) -> Result<bool, String> {
    let alive = |pid| match proc_start_time(pid) {
        Ok((start, state)) if start == start_time_ticks && state != 'Z' && state != 'X' => {
            match (exe, proc_exe(pid)) {
                (None, _) => Ok(true),
                (Some(want), Ok(got)) => Ok(want == got),
                // Exited between the two reads (or a kernel thread): not ours to kill.
                (Some(_), Err(e)) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                (Some(_), Err(e)) => Err(format!("reading /proc/{pid}/exe: {e}")),
            }
        }
        Ok(_) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("reading /proc/{pid}/stat: {e}")),
    };
    if !alive(pid)? {
        return Ok(false);
    }
    let raw = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| format!("pid {pid} out of range"))?;
    match rustix::process::kill_process(raw, rustix::process::Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => return Err(format!("kill -KILL {pid}: {e}")),
    }
    // Wait (bounded) until it is dead; as a zombie it counts as dead (its parent reaps it).
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid)? {
        if Instant::now() >= deadline {
            return Err(format!("pid {pid} still alive 5 s after SIGKILL"));
        }
        thread::sleep(Duration::from_millis(10));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Ledger::recover`, waiting (up to 5 s) while the ledger is `InUse`. Another test of this
    /// binary may be forking a child right now: until its exec, the child holds a copy of every
    /// descriptor, a ledger's (and its lock) from a recovery a moment ago included. A lock goes
    /// with its last descriptor, so wait for that, bounded.
    fn recover_unforked(dir: &Path, instance: &str) -> Result<Option<CleanupReport>, LedgerError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match Ledger::recover(dir, instance) {
                Err(LedgerError::InUse { .. }) if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(10));
                }
                r => return r,
            }
        }
    }

    #[test]
    fn ledger_entries_serialize_as_one_json_object_per_line() {
        let cases = [
            (LedgerEntry::Netns("ns1".into()), r#"{"netns":"ns1"}"#),
            (
                LedgerEntry::Link {
                    name: "veth0".into(),
                    ns: None,
                },
                r#"{"link":{"name":"veth0","ns":null}}"#,
            ),
            (
                LedgerEntry::Cgroup("/sys/fs/cgroup/x".into()),
                r#"{"cgroup":"/sys/fs/cgroup/x"}"#,
            ),
            (
                LedgerEntry::Pid {
                    pid: 42,
                    start_time_ticks: 7,
                    exe: Some("/usr/bin/spillway".into()),
                },
                r#"{"pid":{"pid":42,"start_time_ticks":7,"exe":"/usr/bin/spillway"}}"#,
            ),
            (LedgerEntry::File("/run/x".into()), r#"{"file":"/run/x"}"#),
        ];
        for (entry, json) in cases {
            assert_eq!(serde_json::to_string(&entry).unwrap(), json);
            assert_eq!(serde_json::from_str::<LedgerEntry>(json).unwrap(), entry);
        }
    }

    #[test]
    fn parse_stat_counts_fields_after_the_command_name() {
        // A command name with spaces and a ')' must not shift the fields.
        let stat = "1234 (a b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 10 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((987654, 'S')));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_start_time_is_readable() {
        let (start, state) = proc_start_time(std::process::id()).unwrap();
        assert!(start > 0);
        assert!(matches!(state, 'R' | 'S'));
    }

    #[test]
    fn ledger_refuses_a_stale_file_and_recover_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = Ledger::open(dir.path(), "unit").unwrap();
        let f = dir.path().join("payload");
        l.record(LedgerEntry::File(f.clone())).unwrap();
        fs::write(&f, "x").unwrap();
        // While held, a second open sees a stale ledger and recover sees it in use.
        assert!(matches!(
            Ledger::open(dir.path(), "unit"),
            Err(LedgerError::Stale { .. })
        ));
        assert!(matches!(
            Ledger::recover(dir.path(), "unit"),
            Err(LedgerError::InUse { .. })
        ));
        l.leak();
        let report = recover_unforked(dir.path(), "unit").unwrap().unwrap();
        assert!(report.is_clean(), "{report:?}");
        assert_eq!(report.removed, vec![LedgerEntry::File(f.clone())]);
        assert!(!f.exists());
        assert!(!Ledger::path_for(dir.path(), "unit").exists());
        assert!(recover_unforked(dir.path(), "unit").unwrap().is_none());
    }

    #[test]
    fn recover_skips_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = Ledger::path_for(dir.path(), "torn");
        let gone = dir.path().join("never-created");
        fs::write(
            &path,
            format!(
                "{}\n{{\"file\":\"/x",
                serde_json::to_string(&LedgerEntry::File(gone.clone())).unwrap()
            ),
        )
        .unwrap();
        let report = recover_unforked(dir.path(), "torn").unwrap().unwrap();
        assert_eq!(report.unparsed_lines, 1);
        assert_eq!(report.already_gone, vec![LedgerEntry::File(gone)]);
        assert!(report.ledger_removed);
    }

    #[test]
    fn drop_cleans_up_everything_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        {
            let mut l = Ledger::open(dir.path(), "drop").unwrap();
            l.record(LedgerEntry::File(f.clone())).unwrap();
            fs::write(&f, "x").unwrap();
        }
        assert!(!f.exists());
        assert!(!Ledger::path_for(dir.path(), "drop").exists());
    }
    /// A ledger planted by someone else, naming a file outside the state directory, a process
    /// that is not ours and a cgroup outside our prefix: recover refuses, names the entry, and
    /// neither deletes the file nor kills the process.
    #[test]
    fn recover_refuses_foreign_entries_and_touches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("precious");
        fs::write(&victim, "keep me").unwrap();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let LedgerEntry::Pid {
            start_time_ticks, ..
        } = LedgerEntry::pid(child.id()).unwrap()
        else {
            unreachable!()
        };
        let own = dir.path().join("own.sock");
        fs::write(&own, "").unwrap();
        let cases = [
            format!(r#"{{"file":{:?}}}"#, victim.display().to_string()),
            format!(
                r#"{{"file":"{}/../{}/precious"}}"#,
                dir.path().display(),
                outside.path().display()
            ),
            // Start time and executable copied from the real process: still not one we start.
            format!(
                r#"{{"pid":{{"pid":{},"start_time_ticks":{start_time_ticks},"exe":"/usr/bin/sleep"}}}}"#,
                child.id()
            ),
            format!(
                r#"{{"pid":{{"pid":{},"start_time_ticks":{start_time_ticks}}}}}"#,
                child.id()
            ),
            r#"{"cgroup":"/sys/fs/cgroup/memory/system.slice"}"#.to_string(),
            r#"{"cgroup":"/sys/fs/cgroup/memory/spillway/fo/../../system.slice"}"#.to_string(),
            r#"{"netns":"prod"}"#.to_string(),
            r#"{"link":{"name":"eth0","ns":null}}"#.to_string(),
        ];
        for planted in cases {
            let path = Ledger::path_for(dir.path(), "fo");
            // Our own file first: it must survive too, since nothing may be removed.
            fs::write(
                &path,
                format!("{{\"file\":{:?}}}\n{planted}\n", own.display().to_string()),
            )
            .unwrap();
            let err = recover_unforked(dir.path(), "fo").unwrap_err();
            match &err {
                LedgerError::Foreign { line, entry, .. } => {
                    assert_eq!(*line, 2, "{err}");
                    assert!(!entry.is_empty());
                }
                other => panic!("{planted}: expected Foreign, got {other}"),
            }
            assert!(victim.exists(), "{planted}: deleted a file outside");
            assert!(own.exists(), "{planted}: removed something before refusing");
            assert!(child.try_wait().unwrap().is_none(), "{planted}: killed");
            assert!(path.exists(), "the refused ledger stays for the operator");
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn an_upgraded_binary_the_ledger_recorded_is_recovered_if_it_is_still_trusted() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let sleep = fs::canonicalize("/usr/bin/sleep").unwrap();
        let mut child = Command::new(&sleep).arg("30").spawn().unwrap();
        let pid = serde_json::to_string(&LedgerEntry::pid(child.id()).unwrap()).unwrap();
        let path = Ledger::path_for(dir.path(), "up");
        // Without the binary recorded, the process is none this program starts.
        fs::write(&path, format!("{pid}\n")).unwrap();
        let err = recover_unforked(dir.path(), "up").unwrap_err();
        assert!(matches!(err, LedgerError::Foreign { line: 1, .. }), "{err}");
        assert!(child.try_wait().unwrap().is_none());
        // A binary others could write is refused where it is recorded, and nothing is killed.
        let open = dir.path().join("open-bin");
        fs::copy(&sleep, &open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let exe = |p: &Path| serde_json::to_string(&LedgerEntry::Exe(p.to_owned())).unwrap();
        fs::write(&path, format!("{}\n{pid}\n", exe(&open))).unwrap();
        let err = recover_unforked(dir.path(), "up").unwrap_err();
        assert!(matches!(err, LedgerError::Foreign { line: 1, .. }), "{err}");
        assert!(child.try_wait().unwrap().is_none());
        // A root-owned binary nobody else can write, recorded before the process: recovered.
        fs::write(&path, format!("{}\n{pid}\n", exe(&sleep))).unwrap();
        let report = recover_unforked(dir.path(), "up").unwrap().unwrap();
        assert_eq!(report.removed.len(), 1, "{report:?}");
        assert!(report.failed.is_empty(), "{report:?}");
        let status = child.wait().unwrap();
        assert!(!status.success(), "killed: {status}");
        assert!(!path.exists());
    }

    #[test]
    fn a_corrupt_line_is_refused_but_a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = Ledger::path_for(dir.path(), "co");
        let f = dir.path().join("f");
        fs::write(&f, "").unwrap();
        let entry = serde_json::to_string(&LedgerEntry::File(f.clone())).unwrap();
        // A complete line that is not an entry: refused, nothing removed.
        fs::write(&path, format!("{entry}\nrm -rf /\n")).unwrap();
        let err = recover_unforked(dir.path(), "co").unwrap_err();
        assert!(matches!(err, LedgerError::Corrupt { line: 2, .. }), "{err}");
        assert!(f.exists());
        // The same text without its newline is a crash mid-write: skipped.
        fs::write(&path, format!("{entry}\n{{\"file\":\"/x")).unwrap();
        let report = recover_unforked(dir.path(), "co").unwrap().unwrap();
        assert_eq!(report.unparsed_lines, 1);
        assert!(!f.exists());
    }

    #[test]
    fn an_unsafe_state_dir_or_ledger_is_refused_with_what_was_found() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("state");
        // Created with our explicit mode whatever the umask.
        secure_state_dir(&dir).unwrap();
        let mode = fs::metadata(&dir).unwrap().mode() & 0o7777;
        assert_eq!(mode, STATE_DIR_MODE);
        let f = dir.join("f");
        fs::write(&f, "").unwrap();
        let path = Ledger::path_for(&dir, "un");
        fs::write(
            &path,
            format!("{{\"file\":{:?}}}\n", f.display().to_string()),
        )
        .unwrap();
        // Group- or world-writable state directory.
        for bad in [0o777, 0o775, 0o757] {
            fs::set_permissions(&dir, fs::Permissions::from_mode(bad)).unwrap();
            let err = recover_unforked(&dir, "un").unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, LedgerError::Unsafe { .. }), "{msg}");
            assert!(msg.contains(&dir.display().to_string()), "{msg}");
            assert!(msg.contains(&format!("{bad:04o}")), "{msg}");
            assert!(matches!(
                Ledger::open(&dir, "x"),
                Err(LedgerError::Unsafe { .. })
            ));
            assert!(f.exists());
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        // Owned by someone else.
        rustix::fs::chown(&dir, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
        let err = recover_unforked(&dir, "un").unwrap_err();
        assert!(err.to_string().contains("uid 65534"), "{err}");
        rustix::fs::chown(&dir, Some(rustix::process::geteuid()), None).unwrap();
        // A symlink in place of the directory.
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = recover_unforked(&link, "un").unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        // A world-writable, non-sticky parent.
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let err = recover_unforked(&dir, "un").unwrap_err();
        assert!(
            err.to_string().contains(&base.path().display().to_string()),
            "{err}"
        );
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        // A ledger file writable by others, or a symlink to one.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(
            recover_unforked(&dir, "un"),
            Err(LedgerError::Unsafe { .. })
        ));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let real = dir.join("real");
        fs::rename(&path, &real).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        let err = recover_unforked(&dir, "un").unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(f.exists(), "nothing removed on any refusal");
        fs::set_permissions(base.path(), fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn a_new_ledger_is_0600_under_any_umask() {
        if !crate::test_support::in_own_process(
            "host::ledger::tests::a_new_ledger_is_0600_under_any_umask",
        ) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let old = rustix::process::umask(rustix::fs::Mode::empty());
        let l = Ledger::open(dir.path(), "um");
        rustix::process::umask(old);
        let l = l.unwrap();
        assert_eq!(fs::metadata(l.path()).unwrap().mode() & 0o777, 0o600);
    }
}
