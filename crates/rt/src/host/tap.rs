//! TAP devices: the real-time driver's Ethernet ports into the kernel's network stack.
//!
//! A [`Tap`] is an Ethernet interface whose "wire" is a file descriptor: frames the kernel
//! sends out of the interface are read from the fd, frames written to the fd arrive on the
//! interface. The driver puts one end of each VM port here, usually moved into a network
//! namespace (see [`crate::host::netns`]) that plays the VM.
//!
//! Why raw ioctls and not a crate: we need full control of the virtio-net header
//! (`IFF_VNET_HDR`, [`crate::host::vnet`]) and of offloads (`TUNSETOFFLOAD`), because passing partial
//! checksums and GSO super-frames through untouched is what keeps the TAP path cheap; and of
//! multiqueue (`IFF_MULTI_QUEUE`, one fd per queue) so that queues can be spread over threads.
//! That is five ioctls and one `struct ifreq`, defined below.
//!
//! Lifetime: devices are created non-persistent, so the interface disappears when the last
//! queue fd closes, including when the process crashes. Cleanup relies on exactly that; a
//! caller that makes a device persistent with [`Tap::set_persist`] must record it for removal
//! (a [`crate::host::ledger::LedgerEntry::Link`]).
//!
//! All fds are non-blocking: reads return [`io::ErrorKind::WouldBlock`] when no frame is
//! queued, and a driver waits with `poll`/`epoll` (or [`TapQueue::wait_readable`]).

use std::ffi::c_int;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::fs::{Mode, OFlags};
use thiserror::Error;

use crate::host::vnet::VnetHdr;

/// Errors from creating or configuring a TAP device. Each names the device and the step.
#[derive(Debug, Error)]
pub enum TapError {
    /// The interface name cannot be used (too long, empty, or containing bytes the kernel rejects).
    #[error("invalid TAP interface name {name:?}: {reason}")]
    InvalidName {
        /// The name that was given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The options contradict each other or are out of range.
    #[error("invalid TAP options for {name:?}: {reason}")]
    InvalidOptions {
        /// The interface name.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Opening the clone device failed (no `/dev/net/tun`, or not permitted).
    #[error("opening {path} for TAP {name:?} (queue {queue}): {source}")]
    Open {
        /// The clone device path.
        path: &'static str,
        /// The interface name.
        name: String,
        /// Which queue's fd was being opened.
        queue: u16,
        /// The OS error.
        source: io::Error,
    },
    /// An ioctl on the TAP fd failed.
    #[error("{ioctl}({value:#x}) on TAP {name:?} failed: {source}")]
    Ioctl {
        /// The ioctl's name, e.g. `TUNSETIFF`.
        ioctl: &'static str,
        /// The argument (flags, size or offload bits) that was passed.
        value: u64,
        /// The interface name.
        name: String,
        /// The OS error.
        source: io::Error,
    },
}

/// How to create a TAP device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapOptions {
    /// Prefix every frame with a 12-byte [`VnetHdr`] (`IFF_VNET_HDR`). Needed for offloads.
    pub vnet_hdr: bool,
    /// Let the kernel hand us partial checksums and TSO (and USO where supported) super-frames,
    /// and accept them from us (`TUNSETOFFLOAD`). Requires `vnet_hdr`. Buffers must then hold
    /// [`Tap::FRAME_LEN_MAX`] bytes.
    pub offload: bool,
    /// Number of queues, each its own fd (`IFF_MULTI_QUEUE` when more than one). At least 1.
    pub queues: u16,
}

impl Default for TapOptions {
    /// A single queue with a vnet header and no offloads: every frame fits the MTU and carries
    /// a full checksum, the simplest thing to handle.
    fn default() -> Self {
        TapOptions {
            vnet_hdr: true,
            offload: false,
            queues: 1,
        }
    }
}

/// Which offloads the kernel accepted for a device (see [`TapOptions::offload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offloads {
    /// Partial checksums (`TUN_F_CSUM`): frames may carry [`VnetHdr::F_NEEDS_CSUM`].
    pub csum: bool,
    /// TCP segmentation offload for IPv4 and IPv6 (`TUN_F_TSO4 | TUN_F_TSO6`).
    pub tso: bool,
    /// UDP segmentation offload for IPv4 and IPv6 (`TUN_F_USO4 | TUN_F_USO6`, Linux 6.2+).
    pub uso: bool,
}

// ---- The kernel interface: linux/if_tun.h and linux/if.h -------------------------------------

/// `IFNAMSIZ`: interface names are at most 15 bytes plus a NUL.
const IFNAMSIZ: usize = 16;

const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const IFF_MULTI_QUEUE: i16 = 0x0100;

const TUN_F_CSUM: u32 = 0x01;
const TUN_F_TSO4: u32 = 0x02;
const TUN_F_TSO6: u32 = 0x04;
const TUN_F_USO4: u32 = 0x20;
const TUN_F_USO6: u32 = 0x40;

/// `_IOW('T', nr, int)`: the TAP ioctls all declare an `int` argument (even those that take
/// the value itself rather than a pointer, and `TUNSETIFF`, which takes a `struct ifreq *`).
const fn tun_iow(nr: u32) -> libc::Ioctl {
    // Direction bits differ between architectures (asm-generic/ioctl.h vs. the few that
    // override it); the size field is 13 bits on the latter and 14 elsewhere, same shift.
    #[cfg(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    ))]
    const IOC_WRITE: u32 = 4 << 29;
    #[cfg(not(any(
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "mips",
        target_arch = "mips64",
        target_arch = "sparc",
        target_arch = "sparc64"
    )))]
    const IOC_WRITE: u32 = 1 << 30;
    let size = std::mem::size_of::<c_int>() as u32;
    // `Ioctl` is c_ulong on glibc and c_int on musl; the value fits both (bit 31 is clear).
    (IOC_WRITE | (size << 16) | ((b'T' as u32) << 8) | nr) as libc::Ioctl
}

const TUNSETIFF: libc::Ioctl = tun_iow(202);
const TUNSETPERSIST: libc::Ioctl = tun_iow(203);
const TUNSETOFFLOAD: libc::Ioctl = tun_iow(208);
const TUNSETVNETHDRSZ: libc::Ioctl = tun_iow(216);
const TUNSETVNETLE: libc::Ioctl = tun_iow(220);

/// `struct ifreq` as `TUNSETIFF` uses it: the name, then `ifr_flags` at the start of the union.
/// The union is 24 bytes on 64-bit targets (16 on 32-bit); the kernel copies `sizeof(struct
/// ifreq)` bytes, never more than this.
#[repr(C)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    flags: i16,
    _union_rest: [u8; 22],
}

const TUN_PATH: &str = "/dev/net/tun";

// ---- Devices ---------------------------------------------------------------------------------

/// A TAP network interface and its queues. Dropping it closes every queue fd, which removes the
/// interface unless it was made persistent.
#[derive(Debug)]
pub struct Tap {
    name: String,
    queues: Vec<TapQueue>,
    offloads: Offloads,
}

/// One queue of a [`Tap`]: an fd that reads and writes whole frames. Each queue can be driven
/// from its own thread; the kernel spreads outgoing flows over queues by hash.
#[derive(Debug)]
pub struct TapQueue {
    fd: OwnedFd,
    vnet_hdr: bool,
}

impl Tap {
    /// Longest interface name the kernel accepts (`IFNAMSIZ - 1`).
    pub const NAME_MAX: usize = IFNAMSIZ - 1;

    /// The largest frame a read can return with offloads on: vnet header, Ethernet + 802.1Q
    /// header, and a 64 KiB IP GSO super-frame. Size read buffers to this when offloading; a
    /// smaller buffer makes the kernel drop the frame and fail the read with `EFAULT`.
    pub const FRAME_LEN_MAX: usize = VnetHdr::LEN + 18 + 65535;

    /// Creates the TAP interface `name` (at most [`Tap::NAME_MAX`] bytes; the kernel fills in a
    /// `%d`, and [`Tap::name`] gives the result) in the caller's network namespace, with one
    /// non-blocking, close-on-exec fd per queue. The interface is down and non-persistent.
    pub fn create(name: &str, opts: TapOptions) -> Result<Tap, TapError> {
        validate_name(name)?;
        let invalid = |reason| TapError::InvalidOptions {
            name: name.to_owned(),
            reason,
        };
        if opts.queues == 0 {
            return Err(invalid("queues must be at least 1"));
        }
        if opts.offload && !opts.vnet_hdr {
            return Err(invalid(
                "offload needs vnet_hdr: only the header can describe partial checksums and GSO",
            ));
        }

        let mut flags = IFF_TAP | IFF_NO_PI;
        if opts.vnet_hdr {
            flags |= IFF_VNET_HDR;
        }
        if opts.queues > 1 {
            flags |= IFF_MULTI_QUEUE;
        }

        // The first TUNSETIFF creates the device and tells us its final name; later queues
        // attach to that name.
        let mut actual = name.to_owned();
        let mut queues = Vec::with_capacity(usize::from(opts.queues));
        for queue in 0..opts.queues {
            let fd = rustix::fs::open(
                TUN_PATH,
                OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| TapError::Open {
                path: TUN_PATH,
                name: actual.clone(),
                queue,
                source: e.into(),
            })?;
            actual = set_iff(&fd, &actual, flags)?;
            queues.push(TapQueue {
                fd,
                vnet_hdr: opts.vnet_hdr,
            });
        }

        let mut tap = Tap {
            name: actual,
            queues,
            offloads: Offloads::default(),
        };
        // Header size, endianness and offloads belong to the device, not the queue: set once.
        if opts.vnet_hdr {
            let size: c_int = VnetHdr::LEN as c_int;
            tap.ioctl_ptr("TUNSETVNETHDRSZ", TUNSETVNETHDRSZ, &size)?;
            // Little-endian fields on every host (a no-op on little-endian ones), so that
            // `VnetHdr` can always parse little-endian.
            let le: c_int = 1;
            tap.ioctl_ptr("TUNSETVNETLE", TUNSETVNETLE, &le)?;
        }
        if opts.offload {
            tap.offloads = tap.enable_offloads()?;
        }
        Ok(tap)
    }

    /// Enables checksum + TSO offloads, and USO when the kernel knows it (older kernels reject
    /// unknown bits with `EINVAL`, so USO is tried first and dropped on that error).
    fn enable_offloads(&self) -> Result<Offloads, TapError> {
        let base = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        match self.ioctl_val(
            "TUNSETOFFLOAD",
            TUNSETOFFLOAD,
            base | TUN_F_USO4 | TUN_F_USO6,
        ) {
            Ok(()) => Ok(Offloads {
                csum: true,
                tso: true,
                uso: true,
            }),
            Err(TapError::Ioctl { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                self.ioctl_val("TUNSETOFFLOAD", TUNSETOFFLOAD, base)?;
                Ok(Offloads {
                    csum: true,
                    tso: true,
                    uso: false,
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The interface name as the kernel registered it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether frames carry a [`VnetHdr`] prefix.
    pub fn vnet_hdr(&self) -> bool {
        self.queues[0].vnet_hdr
    }

    /// The offloads in effect (all false unless [`TapOptions::offload`] was set).
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// All queues, in creation order.
    pub fn queues(&self) -> &[TapQueue] {
        &self.queues
    }

    /// Queue `index`, or `None` past the last one.
    pub fn queue(&self, index: usize) -> Option<&TapQueue> {
        self.queues.get(index)
    }

    /// The fd of queue `index`, for registering with `epoll`; `None` past the last queue.
    pub fn as_fd(&self, index: usize) -> Option<BorrowedFd<'_>> {
        self.queues.get(index).map(AsFd::as_fd)
    }

    /// Reads one frame from queue 0; see [`TapQueue::read`].
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.queues[0].read(buf)
    }

    /// Writes one frame to queue 0; see [`TapQueue::write`].
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        self.queues[0].write(frame)
    }

    /// Writes a header and a frame to queue 0; see [`TapQueue::write_vectored`].
    pub fn write_vectored(&self, hdr: &VnetHdr, frame: &[u8]) -> io::Result<usize> {
        self.queues[0].write_vectored(hdr, frame)
    }

    /// Reads a batch from queue 0; see [`TapQueue::read_batch`].
    pub fn read_batch(&self, batch: &mut FrameBatch) -> io::Result<usize> {
        self.queues[0].read_batch(batch)
    }

    /// Makes the interface outlive its fds (`true`) or go away with them (`false`, the default).
    pub fn set_persist(&self, persist: bool) -> Result<(), TapError> {
        self.ioctl_val("TUNSETPERSIST", TUNSETPERSIST, u32::from(persist))
    }

    /// An ioctl whose argument is a pointer to an `int` the kernel reads.
    fn ioctl_ptr(
        &self,
        ioctl: &'static str,
        req: libc::Ioctl,
        arg: &c_int,
    ) -> Result<(), TapError> {
        let fd = self.queues[0].fd.as_raw_fd();
        // SAFETY: `fd` is an open TAP fd owned by `self`; `req` is one of the TUN ioctls that
        // read an `int` through the pointer, and `arg` is a valid `int` for the whole call.
        let rc = unsafe { libc::ioctl(fd, req, std::ptr::from_ref(arg)) };
        self.check(rc, ioctl, u64::from(arg.unsigned_abs()))
    }

    /// An ioctl whose argument is the value itself (`TUNSETOFFLOAD`, `TUNSETPERSIST`).
    fn ioctl_val(&self, ioctl: &'static str, req: libc::Ioctl, value: u32) -> Result<(), TapError> {
        let fd = self.queues[0].fd.as_raw_fd();
        // SAFETY: `fd` is an open TAP fd owned by `self`; these ioctls take the unsigned long
        // argument by value and dereference nothing.
        let rc = unsafe { libc::ioctl(fd, req, libc::c_ulong::from(value)) };
        self.check(rc, ioctl, u64::from(value))
    }

    fn check(&self, rc: c_int, ioctl: &'static str, value: u64) -> Result<(), TapError> {
        if rc < 0 {
            return Err(TapError::Ioctl {
                ioctl,
                value,
                name: self.name.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// Checks a name against the kernel's rules for interface names (`dev_valid_name`), so that
/// the error names the problem instead of being a bare `EINVAL`.
fn validate_name(name: &str) -> Result<(), TapError> {
    let reason = if name.len() > Tap::NAME_MAX {
        Some("longer than 15 bytes (IFNAMSIZ - 1)")
    } else if name.is_empty() {
        Some("empty")
    } else if name == "." || name == ".." {
        Some("'.' and '..' are reserved")
    } else if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
    {
        Some("contains '/', ':', NUL or whitespace")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(TapError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// `TUNSETIFF`: attaches `fd` to the TAP `name` (creating it if needed); returns the name the
/// kernel chose.
fn set_iff(fd: &OwnedFd, name: &str, flags: i16) -> Result<String, TapError> {
    let mut req = IfReq {
        name: [0; IFNAMSIZ],
        flags,
        _union_rest: [0; 22],
    };
    // validate_name() bounded the length to IFNAMSIZ - 1, so a NUL terminator remains.
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: `fd` is an open /dev/net/tun fd; TUNSETIFF reads and writes back one
    // `struct ifreq`, and `req` is a live, writable `#[repr(C)]` value at least that large.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, std::ptr::from_mut(&mut req)) };
    if rc < 0 {
        return Err(TapError::Ioctl {
            ioctl: "TUNSETIFF",
            value: u64::from(flags.unsigned_abs()),
            name: name.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    let len = req.name.iter().position(|&b| b == 0).unwrap_or(IFNAMSIZ);
    Ok(String::from_utf8_lossy(&req.name[..len]).into_owned())
}

impl TapQueue {
    /// Reads one frame (with its [`VnetHdr`] first when the device has one) into `buf`.
    /// Returns the frame's length, or `WouldBlock` when none is queued.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(rustix::io::read(&self.fd, buf)?)
    }

    /// Writes one frame (with its [`VnetHdr`] first when the device has one). A frame is
    /// taken whole or not at all; `WouldBlock` is not returned by TAP writes in practice.
    pub fn write(&self, frame: &[u8]) -> io::Result<usize> {
        Ok(rustix::io::write(&self.fd, frame)?)
    }

    /// Writes `hdr` and `frame` as one frame with `writev`, so a caller holding the frame in
    /// its own buffer need not copy it behind a header. Returns the bytes written, header
    /// included. Fails with `InvalidInput` on a device without a vnet header.
    pub fn write_vectored(&self, hdr: &VnetHdr, frame: &[u8]) -> io::Result<usize> {
        if !self.vnet_hdr {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "write_vectored needs a TAP created with vnet_hdr",
            ));
        }
        let hdr = hdr.to_bytes();
        Ok(rustix::io::writev(
            &self.fd,
            &[IoSlice::new(&hdr), IoSlice::new(frame)],
        )?)
    }

    /// Reads frames into the free slots of `batch` until the queue is empty or the batch is
    /// full; returns how many were added (0 when none was queued: not an error). An error
    /// after some frames were read is held back (it will recur on the next read) so the frames
    /// already taken are not lost.
    pub fn read_batch(&self, batch: &mut FrameBatch) -> io::Result<usize> {
        let mut added = 0;
        while batch.len < batch.capacity() {
            let slot = batch.slot_mut(batch.len);
            match rustix::io::read(&self.fd, slot) {
                Ok(n) => {
                    batch.lens[batch.len] = n;
                    batch.len += 1;
                    added += 1;
                }
                // Interrupted before anything was read: just try again.
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => break,
                Err(_) if added > 0 => break,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(added)
    }

    /// Waits up to `timeout` (forever if `None`) for a frame to be readable; returns whether one
    /// is. For simple loops and tests; a driver with many fds uses `epoll` on [`AsFd::as_fd`].
    pub fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let timeout = timeout
            .map(rustix::time::Timespec::try_from)
            .transpose()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "timeout too large"))?;
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(n) => Ok(n > 0),
            Err(rustix::io::Errno::INTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

impl AsFd for TapQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A reusable set of frame buffers for [`TapQueue::read_batch`]: `capacity` slots of
/// `slot_len` bytes in one allocation made up front, so reading allocates nothing.
#[derive(Debug, Clone)]
pub struct FrameBatch {
    buf: Vec<u8>,
    slot_len: usize,
    lens: Vec<usize>,
    len: usize,
}

impl FrameBatch {
    /// A batch of `capacity` empty slots of `slot_len` bytes each. Use [`Tap::FRAME_LEN_MAX`]
    /// for `slot_len` on a device with offloads, MTU + 14 + 4 + 12 otherwise.
    ///
    /// # Panics
    /// If `capacity` or `slot_len` is zero, or their product overflows.
    pub fn new(capacity: usize, slot_len: usize) -> FrameBatch {
        assert!(
            capacity > 0 && slot_len > 0,
            "a frame batch needs slots and bytes"
        );
        let total = capacity
            .checked_mul(slot_len)
            .expect("frame batch size overflows usize");
        FrameBatch {
            buf: vec![0; total],
            slot_len,
            lens: vec![0; capacity],
            len: 0,
        }
    }

    /// How many frames the batch can hold.
    pub fn capacity(&self) -> usize {
        self.lens.len()
    }

    /// Bytes per slot: the longest frame a slot can take.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// How many frames the batch holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the batch holds no frame.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when every slot is taken.
    pub fn is_full(&self) -> bool {
        self.len == self.capacity()
    }

    /// Forgets all frames, keeping the buffers.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Frame `index` (vnet header included when the device has one), or `None` past the end.
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        (index < self.len).then(|| {
            let start = index * self.slot_len;
            &self.buf[start..start + self.lens[index]]
        })
    }

    /// Frame `index`, mutable (e.g. for [`crate::host::vnet::complete_checksum`] in place).
    pub fn get_mut(&mut self, index: usize) -> Option<&mut [u8]> {
        (index < self.len).then(|| {
            let start = index * self.slot_len;
            &mut self.buf[start..start + self.lens[index]]
        })
    }

    /// The frames in the order they were read.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len).filter_map(|i| self.get(i))
    }

    /// The whole of slot `index`, to read into.
    fn slot_mut(&mut self, index: usize) -> &mut [u8] {
        let start = index * self.slot_len;
        &mut self.buf[start..start + self.slot_len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        assert_eq!(TUNSETIFF, libc::TUNSETIFF);
        assert_eq!(TUNSETPERSIST, libc::TUNSETPERSIST);
        assert_eq!(TUNSETOFFLOAD, libc::TUNSETOFFLOAD);
        assert_eq!(TUNSETVNETHDRSZ, libc::TUNSETVNETHDRSZ);
        assert_eq!(TUNSETVNETLE, libc::TUNSETVNETLE);
        assert_eq!(i32::from(IFF_TAP), libc::IFF_TAP);
        assert_eq!(i32::from(IFF_NO_PI), libc::IFF_NO_PI);
        assert_eq!(i32::from(IFF_VNET_HDR), libc::IFF_VNET_HDR);
        assert_eq!(i32::from(IFF_MULTI_QUEUE), libc::IFF_MULTI_QUEUE);
        assert_eq!(TUN_F_CSUM, libc::TUN_F_CSUM);
        assert_eq!(TUN_F_TSO4, libc::TUN_F_TSO4);
        assert_eq!(TUN_F_TSO6, libc::TUN_F_TSO6);
        assert_eq!(TUN_F_USO4, libc::TUN_F_USO4);
        assert_eq!(TUN_F_USO6, libc::TUN_F_USO6);
    }

    #[test]
    fn ifreq_is_at_least_as_large_as_the_kernels() {
        assert!(std::mem::size_of::<IfReq>() >= std::mem::size_of::<libc::ifreq>());
        assert_eq!(std::mem::offset_of!(IfReq, flags), IFNAMSIZ);
    }

    #[test]
    fn names_are_checked_before_any_syscall() {
        for bad in ["", "abcdefghijklmnop", "a/b", "a b", "a:b", ".", ".."] {
            let err = Tap::create(bad, TapOptions::default()).unwrap_err();
            assert!(
                matches!(err, TapError::InvalidName { .. }),
                "{bad:?}: {err}"
            );
        }
        assert!(
            validate_name("abcdefghijklmno").is_ok(),
            "15 bytes is the limit"
        );
    }

    #[test]
    fn offload_without_vnet_header_is_rejected() {
        let opts = TapOptions {
            vnet_hdr: false,
            offload: true,
            queues: 1,
        };
        let err = Tap::create("swt-invalid", opts).unwrap_err();
        assert!(matches!(err, TapError::InvalidOptions { .. }), "{err}");
        let zero = TapOptions {
            queues: 0,
            ..TapOptions::default()
        };
        assert!(matches!(
            Tap::create("swt-invalid", zero),
            Err(TapError::InvalidOptions { .. })
        ));
    }

    #[test]
    fn frame_batch_tracks_frames_in_fixed_slots() {
        let mut b = FrameBatch::new(3, 8);
        assert!(b.is_empty());
        assert_eq!(b.capacity(), 3);
        b.slot_mut(0)[..2].copy_from_slice(&[1, 2]);
        b.lens[0] = 2;
        b.len = 1;
        assert_eq!(b.get(0), Some(&[1u8, 2][..]));
        assert_eq!(b.get(1), None);
        assert_eq!(b.iter().count(), 1);
        b.clear();
        assert!(b.is_empty() && !b.is_full());
    }
}
