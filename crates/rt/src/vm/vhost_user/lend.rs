//! The spill plane's receive queue in a real guest: the DPU process, which is the device, lends
//! the guest's receive queue 1 ([`device::PLANE_RX`]) to the plane, and the plane (vATC on)
//! writes the frames it processed straight into the buffers the guest posts there, translating
//! each buffer's guest address through its vATC, whose authority is the memory table QEMU
//! gave the DPU process.
//!
//! ## The lease
//!
//! One 64-bit word in a small sealed memfd that the DPU process and every plane map:
//!
//! ```text
//!  63            32 31            1   0
//! +----------------+---------------+----+
//! | holder (pid)   | lend number   |LENT|
//! +----------------+---------------+----+
//! ```
//!
//! - The DPU process sets `LENT` with a new lend number when the queue runs and the memory
//!   table is known ([`Lease::lend`], under the queue's lock), and clears it before it applies
//!   any request of the frontend ([`Lease::revoke`]), then waits until no plane holds it.
//! - A plane delivers a frame only while it holds the lease: it sets its pid as the holder if
//!   `LENT` is set, the lend number is the one its attach carried and nobody holds it
//!   ([`Lease::enter`]), and clears it after the frame's used entry is published
//!   ([`Lease::exit`]). Two planes (the active and the warm one) are thereby never in the queue
//!   at once, and a plane whose attach is stale is never in it at all.
//! - Where the queue stands is the used index in guest memory: a plane takes it as its next
//!   available index when it enters, and publishes one used entry for every chain it takes
//!   before it leaves. A plane killed in the middle leaves the chain unpublished, and the next
//!   holder takes it again; the DPU process clears a dead plane's hold ([`Lease::clear_holder`]).
//!   The guest can scribble on its used index as on any of its memory; that only ever breaks
//!   its own queue (refused as `Broken`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{MemfdFlags, SealFlags};
use spillway_fabric::atc::{Atc, AtcEpoch, AtcError, HostAddr, Iova, Mapping, Perm, VmId};
use virtio_queue::{Queue, QueueT};
use vm_memory::{
    Address, Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion, MemoryRegionAddress, MmapRegion,
};

use super::device::{self, BadChain, Fault, FillError, QUEUE_MAX, ToGuest};
use crate::dpu::vmport::DirectRefused;
use crate::host::vnet::VnetHdr;
use crate::shm::ring::Doorbell;

/// Bytes of the lease's memfd (one page; the word is at offset 0).
const LEASE_BYTES: u64 = 4096;
const LENT: u64 = 1;
const NUMBER_MASK: u64 = 0xffff_fffe;
const HOLDER_SHIFT: u32 = 32;

/// How long the DPU process waits for a plane to leave the queue when it revokes the lease (a
/// frame's copy takes microseconds; a plane stopped in the middle is waited for this long).
pub const REVOKE_WAIT: Duration = Duration::from_millis(100);

/// The lease word, in its own shared memfd.
#[derive(Debug)]
pub struct Lease {
    map: MmapRegion,
    fd: OwnedFd,
}

/// How a revocation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// No plane held the queue (or it left within [`REVOKE_WAIT`], or it was dead).
    Free,
    /// A live plane still held it after [`REVOKE_WAIT`] (it is stopped, or hangs); it is
    /// failed by the caller's upkeep, and it writes nothing more once it sees the lease gone.
    Held(u32),
}

impl Lease {
    /// A new lease, not lent, in a sealed memfd.
    pub fn create() -> io::Result<Lease> {
        let fd = rustix::fs::memfd_create(
            "spillway-vhost-lease",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, LEASE_BYTES)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Lease::map(fd).map_err(io::Error::other)
    }

    /// The lease whose memfd the DPU process sent: it must be sealed against shrinking and hold
    /// the word.
    pub fn from_fd(fd: OwnedFd) -> Result<Lease, String> {
        device::check_sealed(fd.as_fd(), 0, LEASE_BYTES)?;
        Lease::map(fd)
    }

    fn map(fd: OwnedFd) -> Result<Lease, String> {
        let file = std::fs::File::from(fd.try_clone().map_err(|e| e.to_string())?);
        let map = MmapRegion::from_file(FileOffset::new(file, 0), LEASE_BYTES as usize)
            .map_err(|e| format!("mmap: {e}"))?;
        Ok(Lease { map, fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: the mapping is LEASE_BYTES long, page-aligned (so 8-aligned at offset 0),
        // shared and alive as long as `self`; every process that maps it touches the word only
        // through atomics.
        unsafe { &*self.map.as_ptr().cast::<AtomicU64>() }
    }

    /// The DPU process: lends the queue under lend number `number` (the holder, if a plane
    /// still leaves a previous lend, is kept).
    pub fn lend(&self, number: u32) {
        let n = (u64::from(number) << 1) & NUMBER_MASK;
        let _ = self
            .word()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                Some((s & !(NUMBER_MASK | LENT)) | n | LENT)
            });
    }

    /// Whether the queue is lent or held.
    pub fn busy(&self) -> bool {
        let s = self.word().load(Ordering::Acquire);
        s & LENT != 0 || s >> HOLDER_SHIFT != 0
    }

    /// The DPU process: takes the queue back, and waits up to `wait` for the plane in it to
    /// leave. A holder that is no longer a process is cleared.
    pub fn revoke(&self, wait: Duration) -> Revoked {
        let w = self.word();
        w.fetch_and(!LENT, Ordering::SeqCst);
        let start = Instant::now();
        loop {
            let s = w.load(Ordering::Acquire);
            let holder = (s >> HOLDER_SHIFT) as u32;
            if holder == 0 {
                return Revoked::Free;
            }
            if !process_exists(holder) {
                self.clear_holder(holder);
                continue;
            }
            if start.elapsed() >= wait {
                return Revoked::Held(holder);
            }
            std::thread::yield_now();
        }
    }

    /// The DPU process: a plane that died (pid `pid`) holds the queue no more.
    pub fn clear_holder(&self, pid: u32) {
        let _ = self
            .word()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                ((s >> HOLDER_SHIFT) as u32 == pid).then_some(s & 0xffff_ffff)
            });
    }

    /// A plane (pid `me`): takes the queue for one frame if it is lent under `number` and
    /// nobody holds it.
    pub fn enter(&self, number: u32, me: u32) -> bool {
        let n = (u64::from(number) << 1) & NUMBER_MASK;
        self.word()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                (s & LENT != 0 && s & NUMBER_MASK == n && s >> HOLDER_SHIFT == 0)
                    .then_some(s | (u64::from(me) << HOLDER_SHIFT))
            })
            .is_ok()
    }

    /// A plane (pid `me`): leaves the queue (its used entries are published).
    pub fn exit(&self, me: u32) {
        self.clear_holder(me);
    }
}

fn process_exists(pid: u32) -> bool {
    match rustix::process::Pid::from_raw(pid as i32) {
        Some(p) => !matches!(
            rustix::process::test_kill_process(p),
            Err(rustix::io::Errno::SRCH)
        ),
        None => false,
    }
}

/// Where the plane's receive queue lies in guest memory, as the frontend set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSpec {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// One region of the guest's memory table, as the plane maps it: guest address, size, and
/// offset in its memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRegion {
    pub gpa: u64,
    pub size: u64,
    pub offset: u64,
}

/// The host addresses the vATC authority hands out for a guest: its regions in guest-address
/// order, laid end to end from 0. The DPU process and the plane both use this one rule.
pub fn host_starts(regions: &[GuestRegion]) -> impl Iterator<Item = (GuestRegion, u64)> + '_ {
    regions.iter().scan(0u64, |at, r| {
        let start = *at;
        *at = at.saturating_add(r.size);
        Some((*r, start))
    })
}

/// What a lend hands the plane besides the fds (`VatcMsg::AttachGuest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LendSpec {
    /// The lend number the lease carries while this lend holds.
    pub number: u32,
    /// The virtio features the guest's driver acked.
    pub features: u64,
    /// Where the queue lies in guest memory.
    pub ring: RingSpec,
    /// The memory table's regions (1 to `codec::GUEST_REGIONS_MAX`).
    pub regions: Vec<GuestRegion>,
}

/// The vATC authority's regions for a guest's memory table: each region's guest addresses,
/// readable and writable, at its host address ([`host_starts`]).
pub fn authority_mappings(regions: &[GuestRegion]) -> impl Iterator<Item = Mapping> + '_ {
    host_starts(regions).map(|(r, host)| Mapping {
        iova: Iova(r.gpa),
        len: r.size,
        host: HostAddr(host),
        perm: Perm::RW,
    })
}

/// A guest's receive queue 1 as the spill plane holds it.
#[derive(Debug)]
pub struct PlaneGuest {
    /// The vATC's name for the guest.
    pub vm: VmId,
    /// The guest's epoch in the authority when the DPU process lent the queue.
    pub epoch: AtcEpoch,
    mem: GuestMemoryMmap,
    /// Host start of each region of `mem`, in `mem`'s (guest-address) order.
    starts: Vec<u64>,
    queue: Queue,
    used: GuestAddress,
    avail: GuestAddress,
    call: Doorbell,
    lease: Lease,
    number: u32,
    me: u32,
    /// The virtio features the guest's driver acked (fixed while the lend holds: a
    /// `SET_FEATURES` revokes it).
    features: u64,
    irq_pending: bool,
    /// The used index at the last interrupt decision (none yet: the next one interrupts).
    signalled: Option<u16>,
}

impl PlaneGuest {
    /// The plane's end of lend `lend`: `fds` are the lease, the queue's interrupt eventfd and
    /// one memfd per region, in that order; `me` is the plane's pid.
    pub fn new(
        vm: VmId,
        epoch: AtcEpoch,
        lend: &LendSpec,
        fds: Vec<OwnedFd>,
        me: u32,
    ) -> Result<PlaneGuest, String> {
        let (number, ring, regions) = (lend.number, lend.ring, &lend.regions[..]);
        if fds.len() != 2 + regions.len() || regions.is_empty() {
            return Err(format!(
                "{} fds for {} memory regions",
                fds.len(),
                regions.len()
            ));
        }
        let mut fds = fds.into_iter();
        let lease = Lease::from_fd(fds.next().expect("counted"))?;
        let call = Doorbell::from_fd(fds.next().expect("counted")).map_err(|e| e.to_string())?;
        let mut sorted: Vec<(GuestRegion, OwnedFd)> = regions.iter().copied().zip(fds).collect();
        sorted.sort_by_key(|(r, _)| r.gpa);
        let mut mapped = Vec::with_capacity(sorted.len());
        let mut plain = Vec::with_capacity(sorted.len());
        for (k, (r, fd)) in sorted.into_iter().enumerate() {
            mapped.push(device::map_region(k, r, fd)?);
            plain.push(r);
        }
        let starts = host_starts(&plain).map(|(_, s)| s).collect();
        let mem = GuestMemoryMmap::from_regions(mapped).map_err(|e| e.to_string())?;
        let mut queue = Queue::new(QUEUE_MAX).expect("QUEUE_MAX is a power of two");
        if !ring.size.is_power_of_two() || ring.size > QUEUE_MAX {
            return Err(format!("queue size {}", ring.size));
        }
        queue.set_size(ring.size);
        queue
            .try_set_desc_table_address(GuestAddress(ring.desc))
            .and_then(|()| queue.try_set_avail_ring_address(GuestAddress(ring.avail)))
            .and_then(|()| queue.try_set_used_ring_address(GuestAddress(ring.used)))
            .map_err(|e| format!("queue addresses: {e}"))?;
        queue.set_ready(true);
        if !queue.is_valid(&mem) {
            return Err("the queue does not lie in the guest's memory".into());
        }
        Ok(PlaneGuest {
            vm,
            epoch,
            mem,
            starts,
            queue,
            used: GuestAddress(ring.used),
            avail: GuestAddress(ring.avail),
            call,
            lease,
            number,
            me,
            features: lend.features,
            irq_pending: false,
            signalled: None,
        })
    }

    /// The guest addresses the plane needs translated: all of its memory.
    pub fn span(&self) -> (Iova, u64) {
        let first = self.mem.iter().next().map_or(0, |r| r.start_addr().0);
        let end = self
            .mem
            .iter()
            .map(|r| r.start_addr().0 + r.len())
            .max()
            .unwrap_or(first);
        (Iova(first), end - first)
    }

    /// Writes `vnet` (as [`device::to_guest`] has it for this guest) + `frame` into the next
    /// receive chain of the guest's queue 1, each buffer's address translated by `atc`, and
    /// publishes it. A frame whose checksum is to be completed, or that the guest cannot take,
    /// goes the DPU way. Allocates nothing.
    pub fn deliver(
        &mut self,
        atc: &mut Atc,
        vnet: &[u8],
        frame: &[u8],
    ) -> Result<(), DirectRefused> {
        let h = VnetHdr::parse(vnet).unwrap_or(VnetHdr::NONE);
        let hdr = match device::to_guest(self.features, &h) {
            ToGuest::As(out) => out.to_bytes(),
            ToGuest::CompleteChecksum | ToGuest::Refuse => return Err(DirectRefused::Offload),
        };
        if !self.lease.enter(self.number, self.me) {
            return Err(DirectRefused::NotLent);
        }
        let r = self.deliver_held(atc, &hdr, frame);
        self.lease.exit(self.me);
        r
    }

    fn deliver_held(
        &mut self,
        atc: &mut Atc,
        hdr: &[u8; device::NET_HDR_LEN],
        frame: &[u8],
    ) -> Result<(), DirectRefused> {
        let idx = self
            .mem
            .load::<u16>(self.used.unchecked_add(2), Ordering::Acquire)
            .map_err(|_| DirectRefused::Broken)?;
        let idx = u16::from_le(idx);
        self.queue.set_next_avail(idx);
        self.queue.set_next_used(idx);
        let (vm, epoch, starts, mem) = (self.vm, self.epoch, &self.starts, &self.mem);
        let merge = device::mergeable(self.features);
        let mut miss = None;
        let r = device::fill_rx(
            &mut self.queue,
            mem,
            merge,
            hdr,
            frame,
            &mut |addr, bytes| {
                let t = match atc.translate_at(
                    epoch,
                    vm,
                    Iova(addr.0),
                    bytes.len() as u64,
                    Perm::WRITE,
                ) {
                    Ok(t) => t,
                    Err(AtcError::Miss(m)) => {
                        miss = Some(m);
                        return Err(Fault::Miss);
                    }
                    Err(_) => return Err(Fault::Address),
                };
                let mut at = 0usize;
                for s in t.segments() {
                    let n = s.len as usize;
                    write_host(mem, starts, s.host.0, &bytes[at..at + n])?;
                    at += n;
                }
                Ok(())
            },
        );
        match r {
            Ok(0) => Err(DirectRefused::NoBuffer),
            Ok(_) => {
                self.irq_pending = true;
                Ok(())
            }
            // Not taken: the chains stay available (the used index did not move) for the retry
            // after the fill.
            Err(FillError::Miss) => Err(DirectRefused::Miss(miss.expect("a miss was recorded"))),
            Err(FillError::Bad(BadChain::Head) | FillError::Broken) => Err(DirectRefused::Broken),
            Err(FillError::Bad(_)) => {
                self.irq_pending = true;
                Err(DirectRefused::BadDesc)
            }
        }
    }

    /// Interrupts the guest if anything was delivered since the last call and it asked for it.
    pub fn flush_irq(&mut self) {
        if !std::mem::take(&mut self.irq_pending) {
            return;
        }
        let new = self.queue.next_used();
        let old = self.signalled.replace(new);
        let ring = (self.avail, self.queue.size());
        if device::wants_interrupt(
            &self.mem,
            ring,
            device::event_idx(self.features),
            (old, new),
        ) {
            let _ = self.call.kick();
        }
    }
}

/// Writes `bytes` at host address `host` (regions end to end from 0, [`host_starts`]).
fn write_host(mem: &GuestMemoryMmap, starts: &[u64], host: u64, bytes: &[u8]) -> Result<(), Fault> {
    let k = starts
        .partition_point(|&s| s <= host)
        .checked_sub(1)
        .ok_or(Fault::Address)?;
    let region = mem.iter().nth(k).ok_or(Fault::Address)?;
    let off = host - starts[k];
    if off.saturating_add(bytes.len() as u64) > region.len() {
        return Err(Fault::Address);
    }
    region
        .write_slice(bytes, MemoryRegionAddress(off))
        .map_err(|_| Fault::Address)
}
