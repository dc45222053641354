//! vhost-user message framing: one request read from the frontend's socket (its 12-byte header,
//! its body and the fds that came with it), bounded before anything is allocated, and a reply
//! written back. The layout is the protocol's (QEMU's `docs/interop/vhost-user.rst`): every
//! number in the host's byte order, which on the only hosts this runs on is little-endian.
//!
//! ```text
//!  0            4            8            12
//!  +------------+------------+------------+-------------------------+
//!  | request u32| flags u32  | size u32   | body: `size` bytes      |
//!  +------------+------------+------------+-------------------------+
//!  flags: bits 0-1 the version (1), bit 2 a reply, bit 3 "reply wanted" (with REPLY_ACK)
//! ```
//!
//! The fds (`SCM_RIGHTS`) ride on the header's bytes. A body longer than [`BODY_MAX`], more
//! than [`FDS_MAX`] fds, a version other than 1 or a reply flag on a request is a
//! [`MsgError`]: the caller drops the connection, as the protocol says a backend does with a
//! message it cannot parse.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use crate::shm::fdpass;

/// Header bytes.
pub const HEADER_LEN: usize = 12;
/// The largest body taken: the protocol's own bound (`VHOST_USER_MAX_MSG_SIZE`-like 4 KiB; the
/// largest message a net backend gets is a memory table of 8 regions, 264 bytes).
pub const BODY_MAX: usize = 4096;
/// The most fds one message may carry: one per memory region of a `SET_MEM_TABLE`.
pub const FDS_MAX: usize = 8;

const VERSION: u32 = 0x1;
const VERSION_MASK: u32 = 0x3;
/// The flag a reply carries.
pub const FLAG_REPLY: u32 = 0x4;
/// The flag of a request that wants a reply (with `REPLY_ACK` negotiated).
pub const FLAG_NEED_REPLY: u32 = 0x8;

/// Why a message was refused.
#[derive(Debug, thiserror::Error)]
pub enum MsgError {
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    #[error("the frontend closed the connection in the middle of a message")]
    Truncated,
    #[error("header version {0}, expected 1")]
    Version(u32),
    #[error("a reply (flags {0:#x}) where a request was expected")]
    UnexpectedReply(u32),
    #[error("body of {0} bytes, at most {BODY_MAX} taken")]
    TooLong(u32),
    #[error("request {req}: body of {got} bytes, expected {want}")]
    BodySize { req: u32, got: usize, want: usize },
    #[error("request {req}: {got} fds attached, expected {want}")]
    Fds { req: u32, got: usize, want: usize },
}

/// One request from the frontend.
#[derive(Debug)]
pub struct Msg {
    /// The request code (`FrontendReq` as a number; unknown codes are kept, not refused here).
    pub req: u32,
    pub flags: u32,
    pub body: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

impl Msg {
    /// Whether the frontend asked for an acknowledgement.
    pub fn need_reply(&self) -> bool {
        self.flags & FLAG_NEED_REPLY != 0
    }

    /// The body, which must be exactly `want` bytes.
    pub fn body_of(&self, want: usize) -> Result<&[u8], MsgError> {
        if self.body.len() == want {
            Ok(&self.body)
        } else {
            Err(MsgError::BodySize {
                req: self.req,
                got: self.body.len(),
                want,
            })
        }
    }

    /// A `u64` body (features, and the vring index of the fd-carrying requests).
    pub fn u64(&self) -> Result<u64, MsgError> {
        Ok(le_u64(self.body_of(8)?, 0))
    }

    /// A vring-state body: `(index, num)`.
    pub fn vring_state(&self) -> Result<(u32, u32), MsgError> {
        let b = self.body_of(8)?;
        Ok((le_u32(b, 0), le_u32(b, 4)))
    }

    /// Takes at most `max` attached fds, refusing more.
    pub fn take_fds(&mut self, max: usize) -> Result<Vec<OwnedFd>, MsgError> {
        if self.fds.len() > max {
            return Err(MsgError::Fds {
                req: self.req,
                got: self.fds.len(),
                want: max,
            });
        }
        Ok(std::mem::take(&mut self.fds))
    }
}

/// Little-endian `u32` at `off` of `b` (the caller has checked the length).
pub fn le_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// Little-endian `u64` at `off` of `b` (the caller has checked the length).
pub fn le_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Reads one request from `sock` (blocking). `Ok(None)`: the frontend closed the connection
/// between messages.
pub fn read(sock: &UnixStream) -> Result<Option<Msg>, MsgError> {
    let mut hdr = [0u8; HEADER_LEN];
    // The fds arrive with the first bytes of the header.
    let (mut got, fds) = fdpass::recv_with_fds(sock, &mut hdr, FDS_MAX)?;
    if got == 0 {
        return Ok(None);
    }
    let mut s = sock;
    while got < HEADER_LEN {
        match s.read(&mut hdr[got..]) {
            Ok(0) => return Err(MsgError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (req, flags, size) = (le_u32(&hdr, 0), le_u32(&hdr, 4), le_u32(&hdr, 8));
    if flags & VERSION_MASK != VERSION {
        return Err(MsgError::Version(flags & VERSION_MASK));
    }
    if flags & FLAG_REPLY != 0 {
        return Err(MsgError::UnexpectedReply(flags));
    }
    if size as usize > BODY_MAX {
        return Err(MsgError::TooLong(size));
    }
    let mut body = vec![0u8; size as usize];
    s.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => MsgError::Truncated,
        _ => MsgError::Io(e),
    })?;
    Ok(Some(Msg {
        req,
        flags,
        body,
        fds,
    }))
}

/// Writes the reply to request `req` with `body`.
pub fn reply(sock: &UnixStream, req: u32, body: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&req.to_le_bytes());
    out.extend_from_slice(&(VERSION | FLAG_REPLY).to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    let mut s = sock;
    s.write_all(&out)
}

/// Writes a request (the tests' frontend, which speaks the protocol by hand to send what QEMU
/// would not).
pub fn write_request(
    sock: &UnixStream,
    req: u32,
    flags: u32,
    body: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&req.to_le_bytes());
    out.extend_from_slice(&(VERSION | flags).to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    fdpass::send_with_fds(sock, &out, fds)
}
