//! Handing file descriptors to another process over a Unix stream socket (`SCM_RIGHTS`): how a
//! ring's memfd and its doorbell eventfd reach the peer.
//!
//! On a stream socket, ancillary data rides on the data bytes, so [`send_with_fds`] needs at least
//! one data byte to carry fds, and the fds arrive with the first [`recv_with_fds`] that reads the
//! first of those bytes. Use a blocking socket: if a send is cut short, the rest of the data is
//! sent without the fds (which went with the first part).
//!
//! Received fds are close-on-exec (`MSG_CMSG_CLOEXEC`). Receiving more fds than asked for, or a
//! truncated control message (`MSG_CTRUNC`, which means the kernel dropped some), is an error,
//! and the fds that did arrive are closed rather than leaked.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::io::{Errno, IoSlice, IoSliceMut};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

/// The kernel's limit on fds in one `SCM_RIGHTS` message (`SCM_MAX_FD`).
pub const FDS_MAX: usize = 253;

/// Control-buffer space for the largest message, on the stack: no allocation per call.
const CMSG_SPACE_MAX: usize = rustix::cmsg_space!(ScmRights(FDS_MAX));

/// Sends all of `data`, with `fds` attached to its first byte. `fds` may be empty; if it is not,
/// `data` must not be (a stream socket carries ancillary data only with data), and it may hold at
/// most [`FDS_MAX`] fds. The fds stay open here; the peer gets duplicates.
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > FDS_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} fds in one message, the limit is {FDS_MAX}", fds.len()),
        ));
    }
    if !fds.is_empty() && data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "fds need at least one data byte to ride on",
        ));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); CMSG_SPACE_MAX];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other(
            "SCM_RIGHTS message does not fit its buffer",
        ));
    }
    let mut sent = 0;
    while sent < data.len() {
        let iov = [IoSlice::new(&data[sent..])];
        match rustix::net::sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL) {
            Ok(n) => {
                sent += n;
                // The fds went with the first successful call.
                control.clear();
            }
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    }
    Ok(())
}

/// Receives into `buf` (as `recv` does: at least one byte unless the peer closed the socket, in
/// which case 0) and up to `fds_max` fds that came with those bytes. More fds than `fds_max`, or
/// a truncated control message, is an `InvalidData` error and the fds received are closed.
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds_max: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut space = [MaybeUninit::<u8>::uninit(); CMSG_SPACE_MAX];
    // With room for no fds, give the kernel no control buffer at all: any fds sent are then
    // dropped by the kernel and reported as MSG_CTRUNC.
    let room = match fds_max.min(FDS_MAX) {
        0 => 0,
        n => rustix::cmsg_space!(ScmRights(n)),
    };
    let mut control = RecvAncillaryBuffer::new(&mut space[..room]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(msg) => break msg,
            Err(Errno::INTR) => continue,
            Err(errno) => return Err(errno.into()),
        }
    };
    // Take ownership of every fd that arrived before deciding anything, so that each one is
    // closed on every path below (dropping an `OwnedFd` closes it; so does dropping `control`).
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        let got = fds.len();
        drop(fds);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "control message truncated (MSG_CTRUNC): the peer sent more than {fds_max} fds; \
                 closed the {got} received"
            ),
        ));
    }
    if fds.len() > fds_max {
        let got = fds.len();
        drop(fds);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("received {got} fds, at most {fds_max} expected; closed them"),
        ));
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn pipe_fds(n: usize) -> Vec<OwnedFd> {
        (0..n)
            .flat_map(|_| {
                let (r, w) = rustix::pipe::pipe().unwrap();
                [r, w]
            })
            .take(n)
            .collect()
    }

    /// Counts this process's open fds that refer to one of `files` (the originals included).
    /// Only those: the other tests of this binary open and close fds on other threads at the
    /// same time, so a count of every fd is not this test's to assert on (it failed CI once,
    /// 12 fds before and 13 after).
    fn open_fds(files: &[OwnedFd]) -> usize {
        let ids: Vec<_> = files
            .iter()
            .map(|f| {
                let st = rustix::fs::fstat(f).unwrap();
                (st.st_dev, st.st_ino)
            })
            .collect();
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
            .filter(|m| {
                use std::os::unix::fs::MetadataExt;
                ids.contains(&(m.dev(), m.ino()))
            })
            .count()
    }

    #[test]
    fn fds_and_data_arrive_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let fds = pipe_fds(3);
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        send_with_fds(&a, b"hello", &borrowed).unwrap();
        let mut buf = [0u8; 16];
        let (n, got) = recv_with_fds(&b, &mut buf, 3).unwrap();
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(got.len(), 3);
        for (sent, received) in fds.iter().zip(&got) {
            let s = rustix::fs::fstat(sent).unwrap();
            let r = rustix::fs::fstat(received).unwrap();
            assert_eq!((s.st_dev, s.st_ino), (r.st_dev, r.st_ino));
        }
    }

    #[test]
    fn more_fds_than_asked_for_is_an_error_and_closes_them() {
        // Runs the exchange once before counting, so lazily opened fds do not skew the count.
        let (a, b) = UnixStream::pair().unwrap();
        let fds = pipe_fds(4);
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        for fds_max in [0, 1, 3] {
            let before = open_fds(&fds);
            send_with_fds(&a, b"x", &borrowed).unwrap();
            let mut buf = [0u8; 4];
            let err = recv_with_fds(&b, &mut buf, fds_max).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
            assert_eq!(open_fds(&fds), before, "fds leaked with fds_max {fds_max}");
        }
    }

    #[test]
    fn fds_without_data_are_refused() {
        let (a, _b) = UnixStream::pair().unwrap();
        let fds = pipe_fds(1);
        let err = send_with_fds(&a, b"", &[fds[0].as_fd()]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn plain_data_needs_no_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(&a, b"abc", &[]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_fds(&b, &mut buf, 2).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"abc"[..], 0));
    }
}
