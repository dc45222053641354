//! Listening Unix sockets created with an explicit mode and owner, whatever the umask, and the
//! credentials of a connected peer.
//!
//! `bind` creates the socket file with the mode `0777 & ~umask`; a `chmod` afterwards leaves a
//! moment in which anyone the umask let in can connect (and keep the connection). [`bind`]
//! therefore binds inside a fresh private directory (mode 0700) next to the final path, sets
//! the mode and owner there, and only then renames the socket into place with
//! `RENAME_NOREPLACE`, so an existing file at the path (an ordinary file, another testbed's
//! socket) is never replaced. The socket is reachable by its final name only with its final
//! mode.
//!
//! [`peer_cred`] reads `SO_PEERCRED`: the pid, uid and gid of the process that called
//! `connect`, as the kernel recorded them then. Callers decide who may talk to them (the spill
//! plane: the pid we started; a VM endpoint: the uid the testbed names; `spillway ctl`: root or
//! our own uid).

use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// Credentials of a connected peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id of the process that connected.
    pub pid: u32,
    /// Its effective user id.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
}

/// The credentials of the peer of `sock` (`SO_PEERCRED`).
pub fn peer_cred(sock: impl AsFd) -> io::Result<PeerCred> {
    let c = rustix::net::sockopt::socket_peercred(sock)?;
    Ok(PeerCred {
        pid: c.pid.as_raw_nonzero().get() as u32,
        uid: c.uid.as_raw(),
        gid: c.gid.as_raw(),
    })
}

/// Listens at `path` with permission bits `mode` and, if given, owner `uid`, whatever the
/// umask (see the module doc). An existing file at `path` is an `AlreadyExists` error and is
/// left as it is; remove a stale socket first with [`remove_stale`].
pub fn bind(path: &Path, mode: u32, uid: Option<u32>) -> io::Result<UnixListener> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let private = parent.join(format!(".b{}.{n}", std::process::id()));
    // A leftover of a dead process that had our pid: ours to remove.
    let _ = fs::remove_dir_all(&private);
    fs::DirBuilder::new().mode(0o700).create(&private)?;
    let tmp = private.join("s");
    let result = (|| {
        let listener = UnixListener::bind(&tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))?;
        if let Some(uid) = uid {
            rustix::fs::chown(&tmp, Some(rustix::process::Uid::from_raw(uid)), None)?;
        }
        rustix::fs::renameat_with(
            rustix::fs::CWD,
            &tmp,
            rustix::fs::CWD,
            path,
            rustix::fs::RenameFlags::NOREPLACE,
        )?;
        Ok(listener)
    })();
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir(&private);
    result
}

/// Removes a socket file at `path` that nobody listens on (a crashed run's). Anything else is
/// left alone: a file that is not a socket is an `AlreadyExists` error, a socket somebody
/// answers on an `AddrInUse` error.
pub fn remove_stale(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is in use by a running process", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => fs::remove_file(path),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn bind_sets_the_mode_whatever_the_umask_and_never_replaces_a_file() {
        if !crate::test_support::in_own_process(
            "host::unixsock::tests::bind_sets_the_mode_whatever_the_umask_and_never_replaces_a_file",
        ) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let old = rustix::process::umask(rustix::fs::Mode::empty());
        let l = bind(&path, 0o600, None);
        rustix::process::umask(old);
        let _l = l.unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        // Nothing else left in the directory (the private one is gone).
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        let file = dir.path().join("plain");
        fs::write(&file, "keep").unwrap();
        let err = bind(&file, 0o600, None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read_to_string(&file).unwrap(), "keep");
        assert_eq!(
            remove_stale(&file).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        // A socket somebody listens on is not stale.
        assert_eq!(
            remove_stale(&path).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
    }

    #[test]
    fn peer_cred_names_the_connecting_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sock");
        let l = bind(&path, 0o600, None).unwrap();
        let _c = UnixStream::connect(&path).unwrap();
        let (s, _) = l.accept().unwrap();
        let cred = peer_cred(&s).unwrap();
        assert_eq!(cred.pid, std::process::id());
        assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
    }
}
