//! Shared-memory VM ports: a tenant VM's memory as a sealed memfd holding virtio 1.x split
//! virtqueues and their buffers, with the device side (the emulated DPU, and the spill plane
//! when it delivers through the vATC) and the driver side (the VM, here `spillway vm-endpoint`).
//!
//! ## Layout (version 1)
//!
//! The VM creates the memfd and hands it to the DPU process over the port's Unix socket, as a
//! VMM hands guest memory to a vhost-user backend. Everything is derived from three numbers in
//! the header, `queue_size` (N, a power of two), `buf_bytes` (B, a multiple of 64) and
//! `iova_base`; the device recomputes every offset from them and checks the file's size, so a
//! header cannot point it outside the file.
//!
//! ```text
//! file offset
//!      0  header (4 KiB): magic u64 "SPWYVMEM", version u32, queue_size u16, queues u16 = 3,
//!         buf_bytes u32, reserved u32, iova_base u64, total_bytes u64
//!   4096  queue 0 (TX, VM -> DPU)        ring area R bytes   \
//!         queue 1 (RX from the DPU)      ring area R bytes    > R = round_up(16N + 6 + 2N
//!         queue 2 (RX from the spill plane) ring area R bytes /      (to 4) + 6 + 8N, 4096)
//!         buffers of queue 0: N x B bytes, then queue 1's, then queue 2's
//! ```
//!
//! Each ring area is a virtio split virtqueue (virtio 1.1, section 2.6): the descriptor table
//! (N x 16 bytes: `addr u64, len u32, flags u16, next u16`), the driver area ("available ring":
//! `flags u16, idx u16, ring[N] u16`) and, 4-aligned after it, the device area ("used ring":
//! `flags u16, idx u16, ring[N] { id u32, len u32 }`). All little-endian, as virtio 1.x says
//! (this module runs on little-endian hosts only; a compile-time check says so).
//!
//! Descriptors carry device addresses: the buffer at file offset `o` has the IOVA
//! `iova_base + o`. The device turns an IOVA back into a file offset only through a translation
//! (the DPU checks it against the VM's registered regions; the spill plane goes through its
//! [`spillway_fabric::atc::Atc`]). Ring areas are located by the layout, as a virtio device is
//! told its queue addresses once at set-up; they are not translated per packet.
//!
//! Each buffer holds one packet: a 12-byte `virtio_net_hdr_v1` and the frame (no descriptor
//! chains, no indirect descriptors: `VIRTQ_DESC_F_NEXT` / `F_INDIRECT` are refused as bad
//! descriptors). Queue 1 and queue 2 are both receive queues of the VM, as a multi-queue
//! virtio-net device has: the DPU fills queue 1, the spill plane queue 2. A split ring has one
//! device-side writer; giving each engine its own queue keeps that true without a lock across
//! processes.
//!
//! ## Notifications
//!
//! Virtio's flag-based event suppression, made race-free the same way as the vNIC rings (see
//! [`crate::shm::ring`]): a side about to sleep clears its "do not notify me" flag
//! (`VIRTQ_USED_F_NO_NOTIFY` for the device, `VIRTQ_AVAIL_F_NO_INTERRUPT` for the driver),
//! issues a `SeqCst` fence and checks the ring again; a side that published issues a `SeqCst`
//! fence and then reads the other's flag. Kicks (driver to device) and interrupts (device to
//! driver) are eventfds ([`crate::shm::ring::Doorbell`]).
//!
//! ## Trust
//!
//! The VM's memory is untrusted by the device, and the device's writes are untrusted by the
//! VM. Every index, length and address read from shared memory is read once and checked before
//! use; a bad one is a [`VirtqError`], never an out-of-bounds access or a panic. The memfd must
//! be sealed against shrinking, so the peer cannot truncate it under the mapping.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering, fence};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;

use crate::shm::ring::{Mapping, RingError};

#[cfg(not(target_endian = "little"))]
compile_error!(
    "spillway-rt's virtqueues assume a little-endian host (virtio 1.x is little-endian)"
);

/// "SPWYVMEM" as little-endian bytes.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SPWYVMEM");
/// The layout version this module reads and writes.
pub const LAYOUT_VERSION: u32 = 1;
/// Header size; the first ring area starts here.
pub const HEADER_BYTES: usize = 4096;
/// The VM's transmit queue.
pub const QUEUE_TX: usize = 0;
/// The receive queue the DPU fills.
pub const QUEUE_RX_DPU: usize = 1;
/// The receive queue the spill plane fills (through the vATC).
pub const QUEUE_RX_PLANE: usize = 2;
/// Queues in a VM memory.
pub const QUEUES: usize = 3;
/// Bytes of the `virtio_net_hdr_v1` at the start of every buffer.
pub const NET_HDR_BYTES: usize = 12;
/// Smallest and largest queue size.
pub const QUEUE_SIZE_MIN: u16 = 8;
/// See [`QUEUE_SIZE_MIN`].
pub const QUEUE_SIZE_MAX: u16 = 4096;
/// Smallest buffer.
pub const BUF_BYTES_MIN: u32 = 256;
/// Largest buffer: a 64 KiB GSO frame and its header.
pub const BUF_BYTES_MAX: u32 = 128 << 10;

/// `VIRTQ_DESC_F_NEXT`.
pub const DESC_F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`: the device writes this buffer (receive).
pub const DESC_F_WRITE: u16 = 2;
/// `VIRTQ_DESC_F_INDIRECT`.
pub const DESC_F_INDIRECT: u16 = 4;
/// `VIRTQ_AVAIL_F_NO_INTERRUPT`.
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// `VIRTQ_USED_F_NO_NOTIFY`.
pub const USED_F_NO_NOTIFY: u16 = 1;

/// Errors of VM memory and its queues. `Copy`: queue errors are data-path values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VirtqError {
    /// Setting up or mapping the memory failed.
    #[error("VM memory: {0}")]
    Ring(#[from] RingError),
    /// A layout parameter is out of range.
    #[error("VM memory layout: {field} = {value}, expected {expected}")]
    BadLayout {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What was expected.
        expected: &'static str,
    },
    /// The header does not describe this layout (wrong magic, version or size).
    #[error("VM memory header: {field} = {value:#x}, expected {expected:#x}")]
    BadHeader {
        /// The field.
        field: &'static str,
        /// What the file says.
        value: u64,
        /// What was expected.
        expected: u64,
    },
    /// The memfd is not sealed against shrinking.
    #[error("VM memory memfd is not sealed against shrinking")]
    Unsealed,
    /// The driver published more available entries than the queue holds.
    #[error(
        "queue {queue}: available index {avail} is {ahead} ahead of {seen} (queue size {size})"
    )]
    AvailOverrun {
        /// The queue.
        queue: usize,
        /// `avail.idx` as read.
        avail: u16,
        /// Where the device stands.
        seen: u16,
        /// How far ahead.
        ahead: u16,
        /// Queue size.
        size: u16,
    },
    /// A descriptor id, flag, length or address the device cannot use.
    #[error("queue {queue}: descriptor {id}: {what}")]
    BadDesc {
        /// The queue.
        queue: usize,
        /// The descriptor id.
        id: u16,
        /// What is wrong.
        what: &'static str,
    },
    /// The device returned an id that is not outstanding.
    #[error("queue {queue}: used entry names descriptor {id}, which is not in flight")]
    BadUsed {
        /// The queue.
        queue: usize,
        /// The id.
        id: u32,
    },
}

/// The geometry of a VM memory: everything else is derived from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmLayout {
    /// Descriptors per queue (a power of two).
    pub queue_size: u16,
    /// Bytes per buffer (header + frame), a multiple of 64.
    pub buf_bytes: u32,
    /// IOVA of file offset 0 (page-aligned).
    pub iova_base: u64,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

impl VmLayout {
    /// Checks the ranges (see the constants).
    pub fn validate(&self) -> Result<(), VirtqError> {
        let bad = |field, value: u64, expected| VirtqError::BadLayout {
            field,
            value,
            expected,
        };
        if !self.queue_size.is_power_of_two()
            || !(QUEUE_SIZE_MIN..=QUEUE_SIZE_MAX).contains(&self.queue_size)
        {
            return Err(bad(
                "queue_size",
                u64::from(self.queue_size),
                "a power of two in 8..=4096",
            ));
        }
        if !(BUF_BYTES_MIN..=BUF_BYTES_MAX).contains(&self.buf_bytes)
            || !self.buf_bytes.is_multiple_of(64)
        {
            return Err(bad(
                "buf_bytes",
                u64::from(self.buf_bytes),
                "a multiple of 64 in 256..=131072",
            ));
        }
        if !self.iova_base.is_multiple_of(4096)
            || self
                .iova_base
                .checked_add(self.total_bytes() as u64)
                .is_none()
        {
            return Err(bad(
                "iova_base",
                self.iova_base,
                "page-aligned, with the whole memory below 2^64",
            ));
        }
        Ok(())
    }

    fn n(&self) -> usize {
        usize::from(self.queue_size)
    }

    /// Bytes of one queue's ring area.
    pub fn ring_bytes(&self) -> usize {
        round_up(self.used_rel() + 6 + 8 * self.n(), 4096)
    }

    fn used_rel(&self) -> usize {
        round_up(16 * self.n() + 6 + 2 * self.n(), 4)
    }

    /// File offset of queue `q`'s descriptor table.
    pub fn desc_off(&self, q: usize) -> usize {
        HEADER_BYTES + q * self.ring_bytes()
    }

    /// File offset of queue `q`'s driver area (available ring).
    pub fn avail_off(&self, q: usize) -> usize {
        self.desc_off(q) + 16 * self.n()
    }

    /// File offset of queue `q`'s device area (used ring).
    pub fn used_off(&self, q: usize) -> usize {
        self.desc_off(q) + self.used_rel()
    }

    /// File offset of queue `q`'s first buffer.
    pub fn bufs_off(&self, q: usize) -> usize {
        HEADER_BYTES + QUEUES * self.ring_bytes() + q * self.n() * self.buf_bytes as usize
    }

    /// File offset of buffer `id` of queue `q`.
    pub fn buf_off(&self, q: usize, id: u16) -> usize {
        self.bufs_off(q) + usize::from(id) * self.buf_bytes as usize
    }

    /// Bytes of queue `q`'s buffer area.
    pub fn bufs_len(&self) -> usize {
        self.n() * self.buf_bytes as usize
    }

    /// Size of the whole memory.
    pub fn total_bytes(&self) -> usize {
        self.bufs_off(QUEUES)
    }

    /// The IOVA of file offset `off`.
    pub fn iova(&self, off: usize) -> u64 {
        self.iova_base + off as u64
    }
}

/// A descriptor as the device read it (each field read once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    /// Its id (index in the table).
    pub id: u16,
    /// Device address of the buffer.
    pub addr: u64,
    /// Length of the buffer.
    pub len: u32,
    /// Flags.
    pub flags: u16,
}

/// A VM's memory, mapped into this process.
#[derive(Clone)]
pub struct VmMemory {
    map: Arc<Mapping>,
    layout: VmLayout,
}

impl std::fmt::Debug for VmMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmMemory")
            .field("layout", &self.layout)
            .finish()
    }
}

impl VmMemory {
    /// Creates a zeroed, sealed memory for `layout` (the VM's side). `name` labels the memfd.
    pub fn create(name: &str, layout: VmLayout) -> Result<VmMemory, VirtqError> {
        layout.validate()?;
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let fd = match rustix::fs::memfd_create(name, flags | MemfdFlags::NOEXEC_SEAL) {
            Err(Errno::INVAL) => rustix::fs::memfd_create(name, flags),
            other => other,
        }
        .map_err(crate::shm::ring::os("memfd_create"))?;
        let len = layout.total_bytes();
        rustix::fs::ftruncate(&fd, len as u64).map_err(crate::shm::ring::os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(crate::shm::ring::os("fcntl(F_ADD_SEALS)"))?;
        let map = Mapping::map(fd, len)?;
        let mem = VmMemory {
            map: Arc::new(map),
            layout,
        };
        mem.write::<u64>(0, MAGIC);
        mem.write::<u32>(8, LAYOUT_VERSION);
        mem.write::<u16>(12, layout.queue_size);
        mem.write::<u16>(14, QUEUES as u16);
        mem.write::<u32>(16, layout.buf_bytes);
        mem.write::<u64>(24, layout.iova_base);
        mem.write::<u64>(32, len as u64);
        Ok(mem)
    }

    /// Maps a memory received from a VM (the device's side): checks the seals, the header and
    /// that the file is as large as the layout says.
    pub fn from_fd(fd: OwnedFd) -> Result<VmMemory, VirtqError> {
        let seals =
            rustix::fs::fcntl_get_seals(&fd).map_err(crate::shm::ring::os("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(VirtqError::Unsealed);
        }
        let size = rustix::fs::fstat(&fd)
            .map_err(crate::shm::ring::os("fstat"))?
            .st_size as u64;
        if size < HEADER_BYTES as u64 {
            return Err(VirtqError::BadHeader {
                field: "file size",
                value: size,
                expected: HEADER_BYTES as u64,
            });
        }
        // Map the header alone first: the layout it states decides how much to map.
        let head = Mapping::map(fd, HEADER_BYTES)?;
        let peek = VmMemory {
            map: Arc::new(head),
            layout: VmLayout {
                queue_size: 8,
                buf_bytes: 256,
                iova_base: 0,
            },
        };
        let check = |field, value: u64, expected: u64| {
            if value == expected {
                Ok(())
            } else {
                Err(VirtqError::BadHeader {
                    field,
                    value,
                    expected,
                })
            }
        };
        check("magic", peek.read::<u64>(0), MAGIC)?;
        check(
            "version",
            u64::from(peek.read::<u32>(8)),
            u64::from(LAYOUT_VERSION),
        )?;
        check("queues", u64::from(peek.read::<u16>(14)), QUEUES as u64)?;
        let layout = VmLayout {
            queue_size: peek.read::<u16>(12),
            buf_bytes: peek.read::<u32>(16),
            iova_base: peek.read::<u64>(24),
        };
        layout.validate()?;
        let total = layout.total_bytes() as u64;
        check("total_bytes", peek.read::<u64>(32), total)?;
        if size < total {
            return Err(VirtqError::BadHeader {
                field: "file size",
                value: size,
                expected: total,
            });
        }
        let map = Arc::into_inner(peek.map).expect("the only reference");
        let fd = rustix::io::dup(&map.fd).map_err(crate::shm::ring::os("dup"))?;
        drop(map);
        let map = Mapping::map(fd, layout.total_bytes())?;
        Ok(VmMemory {
            map: Arc::new(map),
            layout,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &VmLayout {
        &self.layout
    }

    /// The memfd, to hand to a peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd.as_fd()
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|end| end <= self.map.len),
            "VM memory access [{off}, +{len}) outside {} bytes",
            self.map.len
        );
    }

    /// Reads an integer field at `off` once (volatile: the peer may be writing it).
    fn read<T: Copy>(&self, off: usize) -> T {
        self.check(off, size_of::<T>());
        assert!(off.is_multiple_of(align_of::<T>()));
        // SAFETY: in bounds and aligned (checked above; the base is page-aligned); only used
        // for integer types, for which any bits are a valid value.
        unsafe { self.map.base.as_ptr().add(off).cast::<T>().read_volatile() }
    }

    /// Writes an integer field at `off` (volatile: the peer reads it).
    fn write<T: Copy>(&self, off: usize, v: T) {
        self.check(off, size_of::<T>());
        assert!(off.is_multiple_of(align_of::<T>()));
        // SAFETY: as in `read`; the shared mapping is writable.
        unsafe {
            self.map
                .base
                .as_ptr()
                .add(off)
                .cast::<T>()
                .write_volatile(v)
        }
    }

    fn atomic_u16(&self, off: usize) -> &AtomicU16 {
        self.check(off, 2);
        assert!(off.is_multiple_of(2));
        // SAFETY: in bounds and aligned (checked); the mapping lives as long as `&self`. These
        // ring index and flag words are accessed only atomically in this process.
        unsafe { AtomicU16::from_ptr(self.map.base.as_ptr().add(off).cast()) }
    }

    /// Copies `dst.len()` bytes from file offset `off` (bounds-checked: false if outside).
    pub fn read_bytes(&self, off: usize, dst: &mut [u8]) -> bool {
        if off
            .checked_add(dst.len())
            .is_none_or(|end| end > self.map.len)
        {
            return false;
        }
        // SAFETY: the source range is inside the mapping (checked) and cannot overlap `dst`, a
        // local buffer. The peer may write these bytes concurrently only by breaking the queue
        // protocol; then the copy holds garbage, which the caller parses as untrusted input.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.base.as_ptr().add(off),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        true
    }

    /// Copies `src` to file offset `off` (bounds-checked: false if outside).
    pub fn write_bytes(&self, off: usize, src: &[u8]) -> bool {
        if off
            .checked_add(src.len())
            .is_none_or(|end| end > self.map.len)
        {
            return false;
        }
        // SAFETY: the destination range is inside the writable shared mapping (checked) and
        // cannot overlap `src`, which lives in this process's own memory.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.map.base.as_ptr().add(off), src.len());
        }
        true
    }
}

/// The device's end of one queue: takes what the driver made available, returns it used.
///
/// The device completes every descriptor it takes before taking the next, so `last_avail` and
/// the used index move together and a device that attaches later (a restarted spill plane)
/// resumes from the used index in memory.
#[derive(Debug)]
pub struct DeviceQueue {
    q: usize,
    size: u16,
    last_avail: u16,
    avail_seen: u16,
}

impl DeviceQueue {
    /// Attaches to queue `q` of `mem`, resuming at its used index.
    pub fn attach(mem: &VmMemory, q: usize) -> DeviceQueue {
        assert!(q < QUEUES);
        let l = mem.layout;
        let used = mem.atomic_u16(l.used_off(q) + 2).load(Ordering::Acquire);
        DeviceQueue {
            q,
            size: l.queue_size,
            last_avail: used,
            avail_seen: used,
        }
    }

    /// The next available descriptor, without taking it (`None`: the driver has none posted).
    pub fn peek(&mut self, mem: &VmMemory) -> Result<Option<Desc>, VirtqError> {
        let l = mem.layout;
        if self.avail_seen == self.last_avail {
            self.avail_seen = mem
                .atomic_u16(l.avail_off(self.q) + 2)
                .load(Ordering::Acquire);
            let ahead = self.avail_seen.wrapping_sub(self.last_avail);
            if ahead > self.size {
                return Err(VirtqError::AvailOverrun {
                    queue: self.q,
                    avail: self.avail_seen,
                    seen: self.last_avail,
                    ahead,
                    size: self.size,
                });
            }
            if ahead == 0 {
                return Ok(None);
            }
        }
        let slot = usize::from(self.last_avail % self.size);
        let id = mem.read::<u16>(l.avail_off(self.q) + 4 + 2 * slot);
        if id >= self.size {
            return Err(VirtqError::BadDesc {
                queue: self.q,
                id,
                what: "id beyond the queue size",
            });
        }
        let d = l.desc_off(self.q) + 16 * usize::from(id);
        Ok(Some(Desc {
            id,
            addr: mem.read::<u64>(d),
            len: mem.read::<u32>(d + 8),
            flags: mem.read::<u16>(d + 12),
        }))
    }

    /// Returns the descriptor [`DeviceQueue::peek`] gave, with `len` bytes written, and
    /// publishes it (one used entry per call; publish order is completion order).
    pub fn complete(&mut self, mem: &VmMemory, id: u16, len: u32) {
        let l = mem.layout;
        let used = l.used_off(self.q);
        let slot = usize::from(self.last_avail % self.size);
        mem.write::<u32>(used + 4 + 8 * slot, u32::from(id));
        mem.write::<u32>(used + 4 + 8 * slot + 4, len);
        self.last_avail = self.last_avail.wrapping_add(1);
        mem.atomic_u16(used + 2)
            .store(self.last_avail, Ordering::Release);
    }

    /// After completing: whether the driver wants an interrupt (it cleared
    /// `VIRTQ_AVAIL_F_NO_INTERRUPT` before sleeping).
    pub fn needs_interrupt(&self, mem: &VmMemory) -> bool {
        peer_wants_notice(mem, mem.layout.avail_off(self.q), AVAIL_F_NO_INTERRUPT)
    }

    /// Before sleeping: asks for kicks; false if descriptors arrived meanwhile (do not sleep).
    pub fn prepare_sleep(&mut self, mem: &VmMemory) -> bool {
        let l = mem.layout;
        announce_sleep(
            mem,
            l.used_off(self.q),
            USED_F_NO_NOTIFY,
            l.avail_off(self.q) + 2,
            self.last_avail,
        )
    }

    /// After waking (or while busy): no kicks wanted.
    pub fn woke(&mut self, mem: &VmMemory) {
        mem.atomic_u16(mem.layout.used_off(self.q))
            .store(USED_F_NO_NOTIFY, Ordering::Relaxed);
    }

    /// The queue index.
    pub fn queue(&self) -> usize {
        self.q
    }
}

/// The 16-bit ring words the notification handshake touches, so that the very same two
/// functions run on VM memory in production and on `loom` atomics in `tests/loom_virtq.rs`.
pub trait NoticeWords {
    /// Loads the word at byte offset `off`.
    fn load_u16(&self, off: usize, order: Ordering) -> u16;
    /// Stores the word at byte offset `off`.
    fn store_u16(&self, off: usize, value: u16, order: Ordering);
    /// A `SeqCst` fence.
    fn fence_seq_cst(&self);
}

impl NoticeWords for VmMemory {
    fn load_u16(&self, off: usize, order: Ordering) -> u16 {
        self.atomic_u16(off).load(order)
    }
    fn store_u16(&self, off: usize, value: u16, order: Ordering) {
        self.atomic_u16(off).store(value, order);
    }
    fn fence_seq_cst(&self) {
        fence(Ordering::SeqCst);
    }
}

/// The publishing side's half of the notification handshake (see the module docs): after its
/// index store, a `SeqCst` fence, then the peer's "do not notify me" bit in the flags word at
/// `flags_off`. True: notify the peer.
pub fn peer_wants_notice(mem: &impl NoticeWords, flags_off: usize, no_notice: u16) -> bool {
    mem.fence_seq_cst();
    mem.load_u16(flags_off, Ordering::Relaxed) & no_notice == 0
}

/// The sleeping side's half: clear its own "do not notify me" bit (the flags word at
/// `flags_off`), a `SeqCst` fence, then look again at the peer's index at `idx_off`; if it moved
/// past `seen` there is work, so set the bit again and do not sleep. True: sleep.
pub fn announce_sleep(
    mem: &impl NoticeWords,
    flags_off: usize,
    no_notice: u16,
    idx_off: usize,
    seen: u16,
) -> bool {
    mem.store_u16(flags_off, 0, Ordering::Relaxed);
    mem.fence_seq_cst();
    if mem.load_u16(idx_off, Ordering::Acquire) != seen {
        mem.store_u16(flags_off, no_notice, Ordering::Relaxed);
        return false;
    }
    true
}

/// Checks a descriptor the device took from queue `q` against that queue's buffer area: the
/// direction flag, no chaining, and `[addr, addr + need)` inside one of the queue's buffers'
/// IOVA range. Returns the file offset of the buffer's first byte. This is the DPU's own check
/// (it knows the VM's memory map); the spill plane translates through its vATC instead.
pub fn check_desc(l: &VmLayout, q: usize, d: &Desc, need: usize) -> Result<usize, VirtqError> {
    let bad = |what| VirtqError::BadDesc {
        queue: q,
        id: d.id,
        what,
    };
    if d.flags & (DESC_F_NEXT | DESC_F_INDIRECT) != 0 {
        return Err(bad("chained or indirect descriptors are not supported"));
    }
    let device_writes = q != QUEUE_TX;
    if (d.flags & DESC_F_WRITE != 0) != device_writes {
        return Err(bad(
            "VIRTQ_DESC_F_WRITE does not match the queue's direction",
        ));
    }
    if (d.len as usize) < need {
        return Err(bad("buffer shorter than the packet"));
    }
    let start = l.iova(l.bufs_off(q));
    let end = start + l.bufs_len() as u64;
    let ok = d.addr >= start
        && d.addr
            .checked_add(u64::from(d.len))
            .is_some_and(|e| e <= end);
    if !ok {
        return Err(bad("address outside the queue's buffers"));
    }
    Ok((d.addr - l.iova_base) as usize)
}

/// The driver's (VM's) end of one queue: buffer `id` is always the `id`-th buffer of the
/// queue's area, so a descriptor id names its buffer.
#[derive(Debug)]
pub struct DriverQueue {
    q: usize,
    size: u16,
    avail_idx: u16,
    last_used: u16,
    free: Vec<u16>,
    in_flight: Vec<bool>,
}

impl DriverQueue {
    /// Queue `q` of a fresh memory, every buffer free.
    pub fn new(mem: &VmMemory, q: usize) -> DriverQueue {
        assert!(q < QUEUES);
        let size = mem.layout.queue_size;
        DriverQueue {
            q,
            size,
            avail_idx: 0,
            last_used: 0,
            free: (0..size).rev().collect(),
            in_flight: vec![false; usize::from(size)],
        }
    }

    /// A free buffer id, if any.
    pub fn take_free(&mut self) -> Option<u16> {
        self.free.pop()
    }

    /// Gives back a buffer taken by [`DriverQueue::take_free`] but not posted.
    pub fn put_free(&mut self, id: u16) {
        self.free.push(id);
    }

    /// Free buffers.
    pub fn free_len(&self) -> usize {
        self.free.len()
    }

    /// File offset of buffer `id`.
    pub fn buf_off(&self, mem: &VmMemory, id: u16) -> usize {
        mem.layout.buf_off(self.q, id)
    }

    /// Posts buffer `id` with `len` bytes (for the device to read on TX, or to fill on RX) and
    /// publishes it.
    pub fn post(&mut self, mem: &VmMemory, id: u16, len: u32) {
        let l = mem.layout;
        let d = l.desc_off(self.q) + 16 * usize::from(id);
        let flags = if self.q == QUEUE_TX { 0 } else { DESC_F_WRITE };
        mem.write::<u64>(d, l.iova(l.buf_off(self.q, id)));
        mem.write::<u32>(d + 8, len);
        mem.write::<u16>(d + 12, flags);
        mem.write::<u16>(d + 14, 0);
        let slot = usize::from(self.avail_idx % self.size);
        mem.write::<u16>(l.avail_off(self.q) + 4 + 2 * slot, id);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.in_flight[usize::from(id)] = true;
        mem.atomic_u16(l.avail_off(self.q) + 2)
            .store(self.avail_idx, Ordering::Release);
    }

    /// The next used buffer: its id and the length the device wrote.
    pub fn reclaim(&mut self, mem: &VmMemory) -> Result<Option<(u16, u32)>, VirtqError> {
        let l = mem.layout;
        let used = l.used_off(self.q);
        let idx = mem.atomic_u16(used + 2).load(Ordering::Acquire);
        if idx == self.last_used {
            return Ok(None);
        }
        let slot = usize::from(self.last_used % self.size);
        let id = mem.read::<u32>(used + 4 + 8 * slot);
        let len = mem.read::<u32>(used + 4 + 8 * slot + 4);
        let Some(flight) = usize::try_from(id)
            .ok()
            .and_then(|i| self.in_flight.get_mut(i))
            .filter(|f| **f)
        else {
            return Err(VirtqError::BadUsed { queue: self.q, id });
        };
        *flight = false;
        self.last_used = self.last_used.wrapping_add(1);
        Ok(Some((id as u16, len)))
    }

    /// After posting: whether the device wants a kick.
    pub fn needs_kick(&self, mem: &VmMemory) -> bool {
        peer_wants_notice(mem, mem.layout.used_off(self.q), USED_F_NO_NOTIFY)
    }

    /// Before sleeping: asks for interrupts; false if used buffers arrived meanwhile.
    pub fn prepare_sleep(&mut self, mem: &VmMemory) -> bool {
        let l = mem.layout;
        announce_sleep(
            mem,
            l.avail_off(self.q),
            AVAIL_F_NO_INTERRUPT,
            l.used_off(self.q) + 2,
            self.last_used,
        )
    }

    /// After waking (or while busy): no interrupts wanted.
    pub fn woke(&mut self, mem: &VmMemory) {
        mem.atomic_u16(mem.layout.avail_off(self.q))
            .store(AVAIL_F_NO_INTERRUPT, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> VmLayout {
        VmLayout {
            queue_size: 8,
            buf_bytes: 2048,
            iova_base: 0x10_0000_0000,
        }
    }

    #[test]
    fn layout_offsets_follow_virtio_alignment_and_do_not_overlap() {
        let l = layout();
        l.validate().unwrap();
        for q in 0..QUEUES {
            assert!(l.desc_off(q).is_multiple_of(16));
            assert!(l.avail_off(q).is_multiple_of(2));
            assert!(l.used_off(q).is_multiple_of(4));
            assert!(l.used_off(q) + 6 + 8 * 8 <= l.desc_off(q) + l.ring_bytes());
        }
        assert_eq!(l.bufs_off(0), HEADER_BYTES + 3 * l.ring_bytes());
        assert_eq!(l.total_bytes(), l.bufs_off(0) + 3 * 8 * 2048);
    }

    #[test]
    fn bad_layouts_are_refused_by_field() {
        let mut l = layout();
        l.queue_size = 12;
        assert!(matches!(
            l.validate(),
            Err(VirtqError::BadLayout {
                field: "queue_size",
                ..
            })
        ));
        let mut l = layout();
        l.buf_bytes = 100;
        assert!(matches!(
            l.validate(),
            Err(VirtqError::BadLayout {
                field: "buf_bytes",
                ..
            })
        ));
        let mut l = layout();
        l.iova_base = u64::MAX - 4095;
        assert!(matches!(
            l.validate(),
            Err(VirtqError::BadLayout {
                field: "iova_base",
                ..
            })
        ));
    }

    #[test]
    fn tx_then_rx_round_trip_through_two_mappings() {
        let vm = VmMemory::create("t", layout()).unwrap();
        let dev_mem = VmMemory::from_fd(rustix::io::dup(vm.fd()).unwrap()).unwrap();
        let mut tx = DriverQueue::new(&vm, QUEUE_TX);
        let mut dtx = DeviceQueue::attach(&dev_mem, QUEUE_TX);
        assert_eq!(dtx.peek(&dev_mem).unwrap(), None);
        for n in 0..20u8 {
            let id = match tx.take_free() {
                Some(id) => id,
                None => {
                    let (id, _) = tx.reclaim(&vm).unwrap().unwrap();
                    id
                }
            };
            let off = tx.buf_off(&vm, id);
            assert!(vm.write_bytes(off, &[n; 40]));
            tx.post(&vm, id, 40);
            let d = dtx.peek(&dev_mem).unwrap().unwrap();
            let off = check_desc(dev_mem.layout(), QUEUE_TX, &d, d.len as usize).unwrap();
            let mut got = [0u8; 40];
            assert!(dev_mem.read_bytes(off, &mut got));
            assert_eq!(got, [n; 40]);
            dtx.complete(&dev_mem, d.id, 0);
        }
        // RX: the device writes into a posted buffer.
        let mut rx = DriverQueue::new(&vm, QUEUE_RX_PLANE);
        let id = rx.take_free().unwrap();
        rx.post(&vm, id, 2048);
        let mut drx = DeviceQueue::attach(&dev_mem, QUEUE_RX_PLANE);
        let d = drx.peek(&dev_mem).unwrap().unwrap();
        let off = check_desc(dev_mem.layout(), QUEUE_RX_PLANE, &d, 100).unwrap();
        assert!(dev_mem.write_bytes(off, &[7u8; 100]));
        drx.complete(&dev_mem, d.id, 100);
        assert_eq!(rx.reclaim(&vm).unwrap(), Some((id, 100)));
        let mut got = [0u8; 100];
        assert!(vm.read_bytes(rx.buf_off(&vm, id), &mut got));
        assert_eq!(got, [7u8; 100]);
    }

    #[test]
    fn device_refuses_bad_descriptors_and_overruns() {
        let vm = VmMemory::create("t", layout()).unwrap();
        let l = *vm.layout();
        let mut dq = DeviceQueue::attach(&vm, QUEUE_RX_DPU);
        // A descriptor pointing into the TX buffers (another queue's memory).
        let d = Desc {
            id: 0,
            addr: l.iova(l.bufs_off(QUEUE_TX)),
            len: 2048,
            flags: DESC_F_WRITE,
        };
        assert!(check_desc(&l, QUEUE_RX_DPU, &d, 64).is_err());
        let d = Desc {
            addr: l.iova(l.bufs_off(QUEUE_RX_DPU)),
            ..d
        };
        assert_eq!(
            check_desc(&l, QUEUE_RX_DPU, &d, 64).unwrap(),
            l.bufs_off(QUEUE_RX_DPU)
        );
        // Read-only flag on a receive queue, chaining, too short, overflowing.
        assert!(check_desc(&l, QUEUE_RX_DPU, &Desc { flags: 0, ..d }, 64).is_err());
        assert!(check_desc(&l, QUEUE_RX_DPU, &Desc { flags: 3, ..d }, 64).is_err());
        assert!(check_desc(&l, QUEUE_RX_DPU, &d, 4096).is_err());
        let last = Desc {
            addr: l.iova(l.bufs_off(QUEUE_RX_DPU) + l.bufs_len() - 64),
            len: 128,
            ..d
        };
        assert!(check_desc(&l, QUEUE_RX_DPU, &last, 64).is_err());
        // The driver claims 100 descriptors on a queue of 8.
        vm.atomic_u16(l.avail_off(QUEUE_RX_DPU) + 2)
            .store(100, Ordering::Release);
        assert!(matches!(dq.peek(&vm), Err(VirtqError::AvailOverrun { .. })));
        // An id beyond the queue.
        vm.atomic_u16(l.avail_off(QUEUE_RX_DPU) + 2)
            .store(1, Ordering::Release);
        vm.write::<u16>(l.avail_off(QUEUE_RX_DPU) + 4, 9);
        let mut dq = DeviceQueue::attach(&vm, QUEUE_RX_DPU);
        assert!(matches!(dq.peek(&vm), Err(VirtqError::BadDesc { .. })));
    }

    #[test]
    fn driver_refuses_a_used_entry_not_in_flight() {
        let vm = VmMemory::create("t", layout()).unwrap();
        let mut dq = DriverQueue::new(&vm, QUEUE_TX);
        let mut dev = DeviceQueue::attach(&vm, QUEUE_TX);
        // The device completes id 3 although nothing was posted.
        dev.complete(&vm, 3, 0);
        assert!(matches!(dq.reclaim(&vm), Err(VirtqError::BadUsed { .. })));
    }

    #[test]
    fn a_memory_without_seals_or_with_a_bad_header_is_refused() {
        let fd = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 1 << 20).unwrap();
        assert!(matches!(VmMemory::from_fd(fd), Err(VirtqError::Unsealed)));
        let fd =
            rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 1 << 20).unwrap();
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).unwrap();
        assert!(matches!(
            VmMemory::from_fd(fd),
            Err(VirtqError::BadHeader { field: "magic", .. })
        ));
    }

    #[test]
    fn sleep_protocol_asks_for_exactly_the_notifications_needed() {
        let vm = VmMemory::create("t", layout()).unwrap();
        let mut drv = DriverQueue::new(&vm, QUEUE_TX);
        let mut dev = DeviceQueue::attach(&vm, QUEUE_TX);
        dev.woke(&vm);
        let id = drv.take_free().unwrap();
        drv.post(&vm, id, 16);
        assert!(!drv.needs_kick(&vm), "a busy device wants no kicks");
        assert!(!dev.prepare_sleep(&vm), "work is pending: do not sleep");
        let d = dev.peek(&vm).unwrap().unwrap();
        dev.complete(&vm, d.id, 0);
        assert!(dev.prepare_sleep(&vm));
        let id = drv.take_free().unwrap();
        drv.post(&vm, id, 16);
        assert!(drv.needs_kick(&vm), "a sleeping device wants a kick");
        drv.woke(&vm);
        assert!(
            !dev.needs_interrupt(&vm),
            "a polling driver wants no interrupt"
        );
        assert!(!drv.prepare_sleep(&vm), "a used buffer is waiting");
    }
}
