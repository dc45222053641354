//! The virtio-net device a vhost-user frontend (QEMU) drives: the protocol's state machine
//! ([`Session`], run by the port's service thread, one message at a time) and the data path's
//! view of the same device ([`Device`]: the guest's memory and its virtqueues, which the DPU
//! process's loop reads and fills).
//!
//! ## Two queue pairs
//!
//! The device has two queue pairs (`VHOST_USER_PROTOCOL_F_MQ`; QEMU: `queues=2`, `mq=on`).
//! The DPU process reads both transmit queues ([`TX`], [`TX2`]: the guest spreads its flows
//! over them) and fills receive queue [`RX`]. The second receive queue, [`PLANE_RX`], is the
//! spill plane's: with vATC on the plane writes the frames it processed straight into the
//! buffers the guest posts there, as it does into a shared-memory VM's queue 2; the DPU process
//! never fills it.
//!
//! ## What is shared, and how
//!
//! - **The guest's memory** is a [`GuestMemoryAtomic`]: the session replaces the whole table on
//!   `SET_MEM_TABLE`, and the data path loads the current one for each frame. A table the data
//!   path still holds stays mapped until it lets go (it is reference-counted), so a table change
//!   never unmaps memory under a copy.
//! - **Each virtqueue** is a [`Vring`] under its own mutex: the data path takes it once per
//!   frame (uncontended but for the moments the frontend reconfigures), the session when a
//!   message changes it.
//! - **The kick fds** change under the data path's `poll`: the session bumps [`Device::generation`]
//!   and rings [`Device::changed`], and the data path takes new copies of the fds when it sees a
//!   new generation. An fd it polls stays open while it holds its copy.
//!
//! ## Trust
//!
//! The frontend is the VMM (its uid is checked when it connects); the guest behind it is not
//! trusted at all. Every guest address goes through the memory table: a descriptor outside the
//! guest's memory, a chain with a loop or a bad index, a chain of the wrong direction or a frame
//! too large is a [`BadChain`]: the chain is returned to the guest as used with length 0 and
//! counted, and the loop moves on. An available index that runs more than a queue ahead of the
//! device's ([`ChainError::Broken`]) makes the queue unusable, and the port is reset. A memory
//! region must be a sealed memfd (`F_SEAL_SHRINK`) at least as large as what is mapped of it, so
//! the VMM cannot truncate the file under the mapping (which would fault the DPU process).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_CTRL_VQ, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MQ,
    VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC, VRING_AVAIL_F_NO_INTERRUPT,
};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{
    Address, Bytes, FileOffset, GuestAddress, GuestAddressSpace, GuestMemory, GuestMemoryAtomic,
    GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

use super::lend::{GuestRegion, Lease, REVOKE_WAIT, Revoked, RingSpec};
use super::msg::{self, Msg, MsgError, le_u32, le_u64};
use crate::host::vnet::VnetHdr;
use crate::shm::ring::Doorbell;

/// The guest's receive queue (the device writes frames into its buffers).
pub const RX: usize = 0;
/// The guest's transmit queue (of queue pair 0).
pub const TX: usize = 1;
/// The receive queue of queue pair 1: the spill plane's direct (vATC) delivery.
pub const PLANE_RX: usize = 2;
/// The transmit queue of queue pair 1.
pub const TX2: usize = 3;
/// The transmit queues the DPU process reads.
pub const TXS: [usize; 2] = [TX, TX2];
/// Queue pairs offered (`GET_QUEUE_NUM`).
pub const QUEUE_PAIRS: usize = 2;
/// Virtqueues: two per queue pair (the control queue is QEMU's own).
pub const VRINGS: usize = 2 * QUEUE_PAIRS;
/// The largest queue the frontend may set (QEMU's `rx_queue_size`/`tx_queue_size` go to 1024).
pub const QUEUE_MAX: u16 = 1024;
/// The virtio-net header with `VIRTIO_F_VERSION_1`: 12 bytes, `num_buffers` included.
pub const NET_HDR_LEN: usize = 12;
/// Memory regions a table may have (QEMU sends at most 8 with one message).
pub const REGIONS_MAX: usize = msg::FDS_MAX;
/// The most guest memory the DPU process maps for one VM.
pub const MEMORY_MAX: u64 = 64 << 30;

/// The virtio features offered: virtio 1.x, indirect descriptors, event indices
/// (`EVENT_IDX`: the guest says after which used entry it wants an interrupt, and the device
/// after which available entry it wants a kick, [`wants_interrupt`]), vhost-user's protocol
/// features, checksum and TCP segmentation offload both ways (`CSUM`, `HOST_TSO4/6`: the
/// guest may send partial checksums and 64 KiB super-frames, which cross the fabric whole as a
/// TAP's do; `GUEST_CSUM`, `GUEST_TSO4/6`: it takes them), and mergeable receive buffers
/// (`MRG_RXBUF`: the guest posts buffers of about a page, and a frame larger than one spans
/// several, [`fill_rx`]; without it a guest that takes TSO posts 64 KiB chains, "big packets",
/// and every frame, however small, takes one).
pub const FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_RING_F_INDIRECT_DESC)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | (1 << VIRTIO_NET_F_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_HOST_TSO4)
    | (1 << VIRTIO_NET_F_HOST_TSO6)
    | (1 << VIRTIO_NET_F_CTRL_VQ)
    | (1 << VIRTIO_NET_F_MQ)
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// What a frame needs before it goes into the receive queue of a guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToGuest {
    /// It goes with this header.
    As(VnetHdr),
    /// Its partial checksum is to be completed first (the guest did not take `GUEST_CSUM`); it
    /// then goes with [`VnetHdr::NONE`] (and `num_buffers` 1).
    CompleteChecksum,
    /// A GSO super-frame of a kind the guest did not take: it cannot go whole, and nothing here
    /// segments it.
    Refuse,
}

/// What a frame with header `h` needs for a guest that acked features `acked`: the one rule
/// for which offloads reach which guest.
pub fn to_guest(acked: u64, h: &VnetHdr) -> ToGuest {
    let has = |bit: u32| acked & (1 << bit) != 0;
    let mut out = *h;
    // One buffer; [`fill_rx`] says how many it took when the guest merges them.
    out.num_buffers = 1;
    let gso_ok = match h.gso_type & !VnetHdr::GSO_ECN {
        VnetHdr::GSO_NONE => true,
        VnetHdr::GSO_TCPV4 => has(VIRTIO_NET_F_GUEST_TSO4),
        VnetHdr::GSO_TCPV6 => has(VIRTIO_NET_F_GUEST_TSO6),
        _ => false,
    };
    if !gso_ok {
        return ToGuest::Refuse;
    }
    if !has(VIRTIO_NET_F_GUEST_CSUM) {
        if h.needs_csum() {
            return ToGuest::CompleteChecksum;
        }
        // DATA_VALID is a promise only a guest that takes checksum offload is given.
        out.flags = 0;
    }
    ToGuest::As(out)
}

/// The protocol features offered: acknowledgements on request (`REPLY_ACK`) and more than one
/// queue pair (`MQ`).
pub const PROTOCOL_FEATURES: u64 =
    VhostUserProtocolFeatures::REPLY_ACK.bits() | VhostUserProtocolFeatures::MQ.bits();

/// One virtqueue and what the frontend told us about it.
#[derive(Debug)]
pub struct Vring {
    pub queue: Queue,
    pub kick: Option<Arc<Doorbell>>,
    pub call: Option<Arc<Doorbell>>,
    /// `SET_VRING_ENABLE` (or all rings at once when `PROTOCOL_FEATURES` is not acked).
    pub enabled: bool,
    /// Used entries added since the last interrupt.
    pub irq_due: bool,
    /// The used index at the last interrupt decision (none yet: the next one interrupts).
    pub signalled: Option<u16>,
}

impl Vring {
    fn new() -> Vring {
        Vring {
            queue: Queue::new(QUEUE_MAX).expect("QUEUE_MAX is a power of two"),
            kick: None,
            call: None,
            enabled: false,
            irq_due: false,
            signalled: None,
        }
    }

    /// Takes what the driver acked (`acked`) that changes how the ring runs: event indices,
    /// and a fresh interrupt decision. At the ring's start and at `SET_FEATURES`, whichever
    /// comes last.
    fn take_features(&mut self, acked: u64) {
        self.queue.set_event_idx(event_idx(acked));
        self.signalled = None;
    }

    /// Whether the data path may use the queue: started (a kick fd and ready), enabled.
    pub fn live(&self) -> bool {
        self.enabled && self.queue.ready()
    }
}

/// Counters of the protocol side (the data path counts in its port).
#[derive(Debug, Default)]
pub struct SessionCounters {
    /// Frontend connections served.
    pub connections: AtomicU64,
    /// Requests handled.
    pub requests: AtomicU64,
    /// Requests refused (a bad value, or one this backend does not serve); the connection is
    /// closed after it.
    pub refused: AtomicU64,
    /// Memory tables taken.
    pub mem_tables: AtomicU64,
    /// Requests that waited for the frontend's request rate (`conn::REQUESTS_PER_S`).
    pub throttled: AtomicU64,
    /// Revocations of the plane's queue that found a live plane still in it after
    /// [`lend::REVOKE_WAIT`].
    pub revoke_timeouts: AtomicU64,
}

/// One region of the memory table, kept for lending the plane the guest's memory.
#[derive(Debug)]
pub struct TableRegion {
    pub region: GuestRegion,
    pub fd: OwnedFd,
}

/// The device both sides share.
#[derive(Debug)]
pub struct Device {
    pub mem: GuestMemoryAtomic<GuestMemoryMmap>,
    vrings: [Mutex<Vring>; VRINGS],
    /// Bumped whenever a kick or call fd, a ring's state or the memory table changed.
    pub generation: AtomicU64,
    /// Rung with every new generation, to wake a data path asleep in `poll`.
    pub changed: Doorbell,
    /// The virtio features the driver acked.
    pub acked: AtomicU64,
    pub counters: SessionCounters,
    /// The plane's hold on [`PLANE_RX`] (see [`lend`]).
    pub lease: Lease,
    /// The memory table's regions in guest-address order, with their memfds.
    table: Mutex<Arc<Vec<TableRegion>>>,
    /// A request is being applied ([`Device::begin_change`] to [`Device::end_change`]): no lend
    /// while the device is half changed.
    changing: std::sync::atomic::AtomicBool,
}

impl Device {
    pub fn new() -> Result<Arc<Device>, String> {
        Ok(Arc::new(Device {
            mem: GuestMemoryAtomic::new(GuestMemoryMmap::new()),
            vrings: std::array::from_fn(|_| Mutex::new(Vring::new())),
            generation: AtomicU64::new(0),
            changed: Doorbell::new().map_err(|e| e.to_string())?,
            acked: AtomicU64::new(0),
            counters: SessionCounters::default(),
            lease: Lease::create().map_err(|e| format!("vhost-user lease: {e}"))?,
            table: Mutex::new(Arc::new(Vec::new())),
            changing: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Vring `i` (below [`VRINGS`]), locked. A panic while it was held (there is none on these
    /// paths) would leave it as it was: the state is plain data, so the poison is ignored.
    pub fn vring(&self, i: usize) -> MutexGuard<'_, Vring> {
        self.vrings[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Release);
        let _ = self.changed.kick();
    }

    /// The memory table's regions (empty before the first `SET_MEM_TABLE`).
    pub fn table(&self) -> Arc<Vec<TableRegion>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Where [`PLANE_RX`] lies, and its interrupt eventfd, if it runs.
    pub fn plane_ring(&self) -> Option<(RingSpec, Arc<Doorbell>)> {
        let v = self.vring(PLANE_RX);
        if !v.live() {
            return None;
        }
        let q = &v.queue;
        let spec = RingSpec {
            size: q.size(),
            desc: q.desc_table(),
            avail: q.avail_ring(),
            used: q.used_ring(),
        };
        Some((spec, v.call.clone()?))
    }

    /// The DPU process's loop: lends [`PLANE_RX`] under lend number `number` if the device is
    /// still at generation `seen` (what the loop read the ring and table at), no change is
    /// being applied, and the ring runs.
    pub fn lend_plane(&self, seen: u64, number: u32) -> bool {
        let v = self.vring(PLANE_RX);
        if self.changing.load(Ordering::Acquire)
            || self.generation.load(Ordering::Acquire) != seen
            || !v.live()
        {
            return false;
        }
        self.lease.lend(number);
        true
    }

    /// Before a change: [`PLANE_RX`] is taken back from the plane, and no lend lands until
    /// [`Device::end_change`].
    pub fn begin_change(&self) {
        self.changing.store(true, Ordering::Release);
        self.revoke_plane();
    }

    /// After a change: lends may land again, from what the loop reads from now on.
    pub fn end_change(&self) {
        self.changing.store(false, Ordering::Release);
        self.bump();
    }

    /// Takes [`PLANE_RX`] back from the plane: no plane is in it afterwards (or one stuck in it
    /// is counted), the ring's indices are where the plane left them, and the generation moves
    /// (so a lend computed before cannot land).
    fn revoke_plane(&self) {
        let mut v = self.vring(PLANE_RX);
        if !self.lease.busy() {
            return;
        }
        if let Revoked::Held(pid) = self.lease.revoke(REVOKE_WAIT) {
            self.counters
                .revoke_timeouts
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "spillway::run", pid, "a spill plane did not leave a guest's receive queue");
        }
        if v.live() {
            let mem = self.mem.memory();
            let used = GuestAddress(v.queue.used_ring()).unchecked_add(2);
            if let Ok(idx) = mem.load::<u16>(used, Ordering::Acquire) {
                let idx = u16::from_le(idx);
                v.queue.set_next_avail(idx);
                v.queue.set_next_used(idx);
            }
        }
        self.generation.fetch_add(1, Ordering::Release);
        drop(v);
        let _ = self.changed.kick();
    }

    /// Stops every ring and drops the memory table: the frontend is gone (or broke a queue).
    /// A frontend that connects again sets everything up from the start.
    pub fn reset(&self) {
        self.begin_change();
        *self.table.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(Vec::new());
        for i in 0..VRINGS {
            *self.vring(i) = Vring::new();
        }
        self.mem
            .lock()
            .expect("memory lock")
            .replace(GuestMemoryMmap::new());
        self.acked.store(0, Ordering::Relaxed);
        self.end_change();
    }
}

/// A descriptor chain refused, and why (each counted by the port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadChain {
    /// A head index beyond the queue: the chain cannot even be returned.
    Head,
    /// A descriptor (or the indirect table) outside the guest's memory, or a chain that ends
    /// with `NEXT` still set: a loop, a bad `next`, a nested indirect table.
    Address,
    /// A writable descriptor in a transmit chain, or a readable one in a receive chain.
    Direction,
    /// A transmit chain larger than the largest frame, or a receive chain too small for the
    /// frame (or for the header alone).
    Size,
}

impl BadChain {
    pub fn name(self) -> &'static str {
        match self {
            BadChain::Head => "head",
            BadChain::Address => "address",
            BadChain::Direction => "direction",
            BadChain::Size => "size",
        }
    }
}

/// What a queue operation could not do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// The chain was refused (and returned to the guest when its head allowed it).
    #[error("bad descriptor chain ({})", .0.name())]
    Bad(BadChain),
    /// The queue is unusable: an available index more than a queue ahead, or a used ring the
    /// device cannot write.
    #[error("the guest broke the virtqueue")]
    Broken,
}

/// The next chain the guest made available on `q`, if any. A queue not ready has none; one whose
/// available index runs more than a queue ahead is broken.
fn pop<'m>(
    q: &mut Queue,
    mem: &'m GuestMemoryMmap,
) -> Result<Option<DescriptorChain<&'m GuestMemoryMmap>>, ChainError> {
    next_chain(q, mem).map_err(|_| ChainError::Broken)
}

/// [`pop`] over any guest memory, for [`fill_rx`].
fn next_chain<'m, M: GuestMemory>(
    q: &mut Queue,
    mem: &'m M,
) -> Result<Option<DescriptorChain<&'m M>>, FillError> {
    match q.iter(mem) {
        Ok(mut it) => Ok(it.next()),
        Err(virtio_queue::Error::InvalidAvailRingIndex) => Err(FillError::Broken),
        Err(_) => Ok(None),
    }
}

/// Why a chain with no descriptor was refused: its head is beyond the queue (it cannot even be
/// returned), or its first descriptor could not be read.
fn empty_chain(head: u16, size: u16) -> BadChain {
    if head >= size {
        BadChain::Head
    } else {
        BadChain::Address
    }
}

/// The data path: takes the next frame the guest sent on either transmit queue, its virtio-net
/// header first, into `area`; returns its length. `Ok(None)`: nothing to take (or no ring is
/// running). `turn` (the caller's, kept between calls) alternates the queues, so a guest busy
/// on one still gets the other read.
pub fn recv(dev: &Device, turn: &mut usize, area: &mut [u8]) -> Result<Option<usize>, ChainError> {
    for k in 0..TXS.len() {
        let q = TXS[(*turn + k) % TXS.len()];
        if let Some(r) = recv_on(dev, q, area).transpose() {
            *turn = (*turn + k + 1) % TXS.len();
            return r.map(Some);
        }
    }
    Ok(None)
}

/// [`recv`] on transmit queue `q`.
fn recv_on(dev: &Device, q: usize, area: &mut [u8]) -> Result<Option<usize>, ChainError> {
    let mut v = dev.vring(q);
    if !v.live() {
        return Ok(None);
    }
    let mem = dev.mem.memory();
    let Some(chain) = pop(&mut v.queue, &mem)? else {
        return Ok(None);
    };
    let head = chain.head_index();
    let mut n = 0usize;
    let mut verdict = Ok(());
    let mut more = true;
    let mut seen = 0;
    for d in chain {
        seen += 1;
        more = d.has_next();
        let len = d.len() as usize;
        if d.is_write_only() {
            verdict = Err(BadChain::Direction);
            break;
        }
        if len > area.len() - n {
            verdict = Err(BadChain::Size);
            break;
        }
        if mem.read_slice(&mut area[n..n + len], d.addr()).is_err() {
            verdict = Err(BadChain::Address);
            break;
        }
        n += len;
    }
    if seen == 0 {
        verdict = Err(empty_chain(head, v.queue.size()));
    } else if verdict.is_ok() && more {
        verdict = Err(BadChain::Address);
    }
    if verdict.is_ok() && n < NET_HDR_LEN {
        verdict = Err(BadChain::Size);
    }
    if verdict != Err(BadChain::Head) {
        v.queue
            .add_used(&*mem, head, 0)
            .map_err(|_| ChainError::Broken)?;
        v.irq_due = true;
    }
    verdict.map(|()| Some(n)).map_err(ChainError::Bad)
}

/// Why [`fill_rx`]'s writer could not write a piece of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The address is outside what may be written (the chain is refused: [`BadChain::Address`]).
    Address,
    /// The address has no translation yet (the chain is left for a retry).
    Miss,
}

/// How [`fill_rx`] writes a piece of a frame: the guest address and the bytes that go
/// there.
pub type Writer<'a> = dyn FnMut(GuestAddress, &[u8]) -> Result<(), Fault> + 'a;

/// Why [`fill_rx`] did not fill a guest's receive chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillError {
    Bad(BadChain),
    Miss,
    /// The queue is unusable (an available index more than a queue ahead, a used ring that
    /// cannot be written): [`fill_rx`] only.
    Broken,
}

/// Writes `hdr` then `frame` across the writable descriptors of receive chain `chain`, each
/// piece through `write` (the guest address and the bytes that go there); returns the bytes
/// written. The rest of a chain longer than needed is the guest's to reuse.
fn fill_chain<M>(
    chain: DescriptorChain<M>,
    queue_size: u16,
    hdr: &[u8],
    frame: &[u8],
    write: &mut Writer<'_>,
) -> Result<u32, FillError>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    let head = chain.head_index();
    let (mut src, mut rest) = (hdr, frame);
    let (written, seen, more) = write_chain(chain, usize::MAX, (&mut src, &mut rest), write)?;
    if src.is_empty() && rest.is_empty() {
        return Ok(written as u32);
    }
    if seen == 0 {
        return Err(FillError::Bad(empty_chain(head, queue_size)));
    }
    Err(FillError::Bad(if more {
        BadChain::Address
    } else {
        BadChain::Size
    }))
}

/// Writes the stream `src` then `rest` (both advanced past what went) across the writable
/// descriptors of `chain`, at most `cap` bytes; returns the bytes written, the descriptors
/// seen and whether the last one seen pointed to another. The one walk of a receive chain.
fn write_chain<'a, M>(
    chain: DescriptorChain<M>,
    cap: usize,
    (src, rest): (&mut &'a [u8], &mut &'a [u8]),
    write: &mut Writer<'_>,
) -> Result<(usize, usize, bool), FillError>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    let (mut written, mut seen, mut more) = (0usize, 0usize, true);
    for d in chain {
        seen += 1;
        more = d.has_next();
        if !d.is_write_only() {
            return Err(FillError::Bad(BadChain::Direction));
        }
        let mut addr = d.addr();
        let mut room = (d.len() as usize).min(cap - written);
        while room > 0 && !(src.is_empty() && rest.is_empty()) {
            if src.is_empty() {
                (*src, *rest) = (*rest, &[]);
            }
            let k = room.min(src.len());
            match write(addr, &src[..k]) {
                Ok(()) => {}
                Err(Fault::Address) => return Err(FillError::Bad(BadChain::Address)),
                Err(Fault::Miss) => return Err(FillError::Miss),
            }
            *src = &src[k..];
            room -= k;
            written += k;
            addr = addr.unchecked_add(k as u64);
        }
        if (src.is_empty() && rest.is_empty()) || written == cap {
            break;
        }
    }
    Ok((written, seen, more))
}

/// The bytes the writable descriptors of receive chain `chain` hold, or why it is refused.
fn chain_room<M>(chain: DescriptorChain<M>, queue_size: u16) -> Result<usize, BadChain>
where
    M: std::ops::Deref,
    M::Target: vm_memory::GuestMemory,
{
    let head = chain.head_index();
    let (mut room, mut seen, mut more) = (0usize, 0usize, true);
    for d in chain {
        seen += 1;
        more = d.has_next();
        if !d.is_write_only() {
            return Err(BadChain::Direction);
        }
        room = room.saturating_add(d.len() as usize);
    }
    if seen == 0 {
        return Err(empty_chain(head, queue_size));
    }
    if more {
        // The chain broke off: a next index beyond the table, or a loop.
        return Err(BadChain::Address);
    }
    Ok(room)
}

/// Receive chains one frame may take with mergeable buffers: a 64 KiB super-frame in the
/// smallest buffers Linux posts (1,518 bytes and the header) takes 44.
pub const MERGE_MAX: usize = 64;

/// Whether a guest that acked `acked` merges receive buffers.
pub fn mergeable(acked: u64) -> bool {
    acked & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0
}

/// Writes `hdr` (the virtio-net header [`to_guest`] made) and `frame` into the receive chains
/// the guest posted on `queue`, each piece through `write`, and returns them used. Without
/// mergeable buffers the frame fills one chain. With them (`mergeable`) it takes as many
/// chains as their room needs, at most [`MERGE_MAX`], and the header's `num_buffers` says how
/// many; their used entries are published together, so the guest never sees part of a frame.
/// The one rule for filling a guest's receive queue: the DPU process's ([`send`], through the
/// memory table) and the spill plane's (through its vATC).
///
/// `Ok(n)`: written into `n` buffers. `Ok(0)`: too few posted; nothing taken. `Err(Miss)`: a
/// translation missed; nothing taken, for the retry after the fill. `Err(Bad(b))`: a chain was
/// refused; the chains taken for the frame are returned used with length 0 (but a head beyond
/// the queue).
pub fn fill_rx<M: GuestMemory>(
    queue: &mut Queue,
    mem: &M,
    mergeable: bool,
    hdr: &[u8; NET_HDR_LEN],
    frame: &[u8],
    write: &mut Writer<'_>,
) -> Result<usize, FillError> {
    let start = queue.next_avail();
    let size = queue.size();
    if !mergeable {
        let Some(chain) = next_chain(queue, mem)? else {
            return Ok(0);
        };
        let head = chain.head_index();
        return match fill_chain(chain, size, hdr, frame, write) {
            Ok(n) => publish_used(queue, mem, &[(head, n)]).map(|()| 1),
            Err(FillError::Miss) => {
                queue.set_next_avail(start);
                Err(FillError::Miss)
            }
            Err(e @ (FillError::Bad(BadChain::Head) | FillError::Broken)) => Err(e),
            Err(e) => publish_used(queue, mem, &[(head, 0)]).and(Err(e)),
        };
    }
    // First the room of as many chains as the frame needs, then the writes, the header saying
    // how many.
    let need = hdr.len() + frame.len();
    let mut taken = [(0u16, 0u32); MERGE_MAX];
    let (mut n, mut room) = (0usize, 0usize);
    while room < need {
        if n == MERGE_MAX {
            return refuse(queue, mem, &mut taken[..n], BadChain::Size);
        }
        let Some(chain) = next_chain(queue, mem)? else {
            queue.set_next_avail(start);
            return Ok(0);
        };
        let head = chain.head_index();
        match chain_room(chain, size) {
            Ok(r) => {
                taken[n] = (head, u32::try_from(r).unwrap_or(u32::MAX));
                room += r;
                n += 1;
            }
            Err(BadChain::Head) => return refuse(queue, mem, &mut taken[..n], BadChain::Head),
            Err(b) => {
                taken[n] = (head, 0);
                return refuse(queue, mem, &mut taken[..=n], b);
            }
        }
    }
    let mut h = *hdr;
    h[NET_HDR_LEN - 2..].copy_from_slice(&(n as u16).to_le_bytes());
    queue.set_next_avail(start);
    let (mut src, mut rest) = (&h[..], frame);
    for i in 0..n {
        // The same chains again: the guest cannot take back what it made available.
        let Some(chain) = next_chain(queue, mem)? else {
            return Err(FillError::Broken);
        };
        let head = chain.head_index();
        match write_chain(chain, taken[i].1 as usize, (&mut src, &mut rest), write) {
            Ok((w, _, _)) => taken[i] = (head, w as u32),
            Err(FillError::Miss) => {
                queue.set_next_avail(start);
                return Err(FillError::Miss);
            }
            Err(FillError::Bad(b)) => {
                queue.set_next_avail(start.wrapping_add(n as u16));
                return refuse(queue, mem, &mut taken[..n], b);
            }
            Err(FillError::Broken) => return Err(FillError::Broken),
        }
    }
    if !(src.is_empty() && rest.is_empty()) {
        // The guest rewrote its chains between the two walks.
        return refuse(queue, mem, &mut taken[..n], BadChain::Size);
    }
    publish_used(queue, mem, &taken[..n]).map(|()| n)
}

/// Returns the chains `taken` used with length 0 and refuses the frame for `why`.
fn refuse<M: GuestMemory>(
    queue: &mut Queue,
    mem: &M,
    taken: &mut [(u16, u32)],
    why: BadChain,
) -> Result<usize, FillError> {
    for t in taken.iter_mut() {
        t.1 = 0;
    }
    publish_used(queue, mem, taken)?;
    Err(FillError::Bad(why))
}

/// Adds `used` (head, length) to the used ring and then moves its index once, past all of them.
fn publish_used<M: GuestMemory>(
    q: &mut Queue,
    mem: &M,
    used: &[(u16, u32)],
) -> Result<(), FillError> {
    if used.is_empty() {
        return Ok(());
    }
    let (size, ring) = (q.size(), GuestAddress(q.used_ring()));
    let mut next = q.next_used();
    for &(head, len) in used {
        if head >= size {
            return Err(FillError::Broken);
        }
        let mut e = [0u8; 8];
        e[..4].copy_from_slice(&u32::from(head).to_le_bytes());
        e[4..].copy_from_slice(&len.to_le_bytes());
        let at = ring
            .checked_add(4 + 8 * u64::from(next % size))
            .ok_or(FillError::Broken)?;
        mem.write_slice(&e, at).map_err(|_| FillError::Broken)?;
        next = next.wrapping_add(1);
    }
    let idx = ring.checked_add(2).ok_or(FillError::Broken)?;
    mem.store(next.to_le(), idx, Ordering::Release)
        .map_err(|_| FillError::Broken)?;
    q.set_next_used(next);
    Ok(())
}

/// The data path: writes `hdr` (the 12-byte virtio-net header) and `frame` into the receive
/// buffers the guest posted on [`RX`] ([`fill_rx`]); returns how many it took. `Ok(0)`: too
/// few buffers posted (or the ring is not running).
pub fn send(dev: &Device, hdr: &[u8; NET_HDR_LEN], frame: &[u8]) -> Result<usize, ChainError> {
    let mut v = dev.vring(RX);
    if !v.live() {
        return Ok(0);
    }
    let mem = dev.mem.memory();
    let m: &GuestMemoryMmap = &mem;
    let merge = mergeable(dev.acked.load(Ordering::Relaxed));
    let r = fill_rx(&mut v.queue, m, merge, hdr, frame, &mut |addr, bytes| {
        m.write_slice(bytes, addr).map_err(|_| Fault::Address)
    });
    match r {
        Ok(n) => {
            v.irq_due |= n > 0;
            Ok(n)
        }
        Err(FillError::Bad(b)) => {
            v.irq_due = true;
            Err(ChainError::Bad(b))
        }
        Err(FillError::Broken) => Err(ChainError::Broken),
        Err(FillError::Miss) => unreachable!("the memory table has no misses"),
    }
}

/// The data path: interrupts the guest for ring `i` if it got used entries since the last
/// interrupt and has not asked for none (`VRING_AVAIL_F_NO_INTERRUPT`).
pub fn flush_irq(dev: &Device, i: usize) {
    let mut v = dev.vring(i);
    if !v.irq_due || !v.live() {
        return;
    }
    v.irq_due = false;
    let mem = dev.mem.memory();
    let new = v.queue.next_used();
    let old = v.signalled.replace(new);
    let ring = (GuestAddress(v.queue.avail_ring()), v.queue.size());
    if wants_interrupt(&mem, ring, v.queue.event_idx_enabled(), (old, new))
        && let Some(call) = &v.call
    {
        let _ = call.kick();
    }
}

/// Whether the guest wants an interrupt on the queue whose available ring is at `avail` (of
/// `size` entries), now that the used index moved from `old` (at the last decision; none yet:
/// it does) to `new`. With event indices (`event_idx`), when the used index passed the
/// `used_event` the guest wrote behind its available ring; without, unless it set
/// `VRING_AVAIL_F_NO_INTERRUPT`. The one rule for the DPU's queues and the plane's.
pub(crate) fn wants_interrupt(
    mem: &GuestMemoryMmap,
    (avail, size): (GuestAddress, u16),
    event_idx: bool,
    (old, new): (Option<u16>, u16),
) -> bool {
    if !event_idx {
        return !mem
            .load::<u16>(avail, Ordering::Acquire)
            .is_ok_and(|f| u16::from_le(f) & VRING_AVAIL_F_NO_INTERRUPT as u16 != 0);
    }
    let Some(old) = old else {
        return true;
    };
    // The used index is published; what the guest asked for is read after it (a full fence,
    // as the driver's side has between its used-event write and its read of the index).
    std::sync::atomic::fence(Ordering::SeqCst);
    let Some(event) = avail
        .checked_add(4 + 2 * u64::from(size))
        .and_then(|a| mem.load::<u16>(a, Ordering::Acquire).ok())
        .map(u16::from_le)
    else {
        return true;
    };
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Whether a guest that acked `acked` uses event indices.
pub fn event_idx(acked: u64) -> bool {
    acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0
}

/// Maps memory region `k` of a table, `r` in file `fd`: the file must be sealed against
/// shrinking and hold the region ([`check_sealed`]). The one mapping of guest memory, for the
/// DPU process's session and the plane's lend.
pub(crate) fn map_region(k: usize, r: GuestRegion, fd: OwnedFd) -> Result<GuestRegionMmap, String> {
    check_sealed(fd.as_fd(), r.offset, r.size).map_err(|e| format!("memory region {k}: {e}"))?;
    let size =
        usize::try_from(r.size).map_err(|_| format!("memory region {k}: size {}", r.size))?;
    let file = FileOffset::new(std::fs::File::from(fd), r.offset);
    let region =
        MmapRegion::from_file(file, size).map_err(|e| format!("memory region {k}: mmap: {e}"))?;
    GuestRegionMmap::new(region, GuestAddress(r.gpa))
        .ok_or_else(|| format!("memory region {k}: beyond the guest address space"))
}

/// Chains the guest made available on ring `q` that the device has not taken (0 for a ring not
/// running).
pub fn available(dev: &Device, q: usize) -> u16 {
    let v = dev.vring(q);
    if !v.live() {
        return 0;
    }
    let mem = dev.mem.memory();
    v.queue
        .avail_idx(&*mem, Ordering::Acquire)
        .map_or(0, |i| (i - std::num::Wrapping(v.queue.next_avail())).0)
}

/// The data path, before it sleeps: asks the guest for a kick on its transmit queues and says
/// whether it may sleep (nothing arrived meanwhile). A queue not running may always sleep.
pub fn prepare_sleep(dev: &Device) -> bool {
    let mem = dev.mem.memory();
    let mut armed = true;
    for q in TXS {
        let mut v = dev.vring(q);
        if v.live() {
            // `enable_notification` re-reads the available index after a full fence: `true`
            // if the guest posted a chain the device has not taken.
            armed &= !matches!(v.queue.enable_notification(&*mem), Ok(true));
        }
    }
    armed
}

/// The data path, awake again: no kicks while it polls, and the kick counters reset.
pub fn woke(dev: &Device) {
    let mem = dev.mem.memory();
    for q in TXS {
        let mut v = dev.vring(q);
        if !v.live() {
            continue;
        }
        let _ = v.queue.disable_notification(&*mem);
        if let Some(k) = &v.kick {
            let _ = k.drain();
        }
    }
}

/// The transmit queues' kick fds, for the data path to poll (copies it keeps; see the module
/// doc).
pub fn tx_kicks(dev: &Device) -> [Option<Arc<Doorbell>>; TXS.len()] {
    TXS.map(|q| dev.vring(q).kick.clone())
}

/// A memory region as the frontend described it, kept to turn the ring addresses it gives (its
/// own virtual addresses) into guest addresses.
#[derive(Clone, Copy, Debug)]
struct Region {
    gpa: u64,
    size: u64,
    uaddr: u64,
}

/// The protocol side of one frontend connection: applies each request to the [`Device`].
#[derive(Debug)]
pub struct Session {
    dev: Arc<Device>,
    regions: Vec<Region>,
    protocol: u64,
    acked: Option<u64>,
}

/// What a request asks the thread to do next.
#[derive(Debug)]
pub enum Answer {
    /// Nothing to send.
    None,
    /// This reply body.
    Reply(Vec<u8>),
}

/// A request refused: why, for the log.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Msg(#[from] MsgError),
    #[error("{0}")]
    Refused(String),
}

fn refused(what: impl Into<String>) -> RequestError {
    RequestError::Refused(what.into())
}

impl Session {
    pub fn new(dev: Arc<Device>) -> Session {
        dev.counters.connections.fetch_add(1, Ordering::Relaxed);
        Session {
            dev,
            regions: Vec::new(),
            protocol: 0,
            acked: None,
        }
    }

    /// Applies `m`. On `Ok`, the caller sends the answer, and an acknowledgement of 0 when the
    /// request wanted one (`REPLY_ACK`) and has no reply of its own; on `Err` an acknowledgement
    /// of 1 if wanted, and then it closes the connection.
    pub fn handle(&mut self, m: &mut Msg) -> Result<Answer, RequestError> {
        self.dev.counters.requests.fetch_add(1, Ordering::Relaxed);
        let r = self.apply(m);
        if r.is_err() {
            self.dev.counters.refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Whether an acknowledgement goes back for `m` (with `REPLY_ACK`, when asked, for the
    /// requests that have no reply of their own).
    pub fn wants_ack(&self, m: &Msg) -> bool {
        let own_reply = [
            FrontendReq::GET_FEATURES,
            FrontendReq::GET_PROTOCOL_FEATURES,
            FrontendReq::GET_VRING_BASE,
            FrontendReq::GET_QUEUE_NUM,
        ]
        .iter()
        .any(|r| u32::from(*r) == m.req);
        m.need_reply()
            && !own_reply
            && self.protocol & VhostUserProtocolFeatures::REPLY_ACK.bits() != 0
    }

    fn ring(&self, index: u32) -> Result<usize, RequestError> {
        match index as usize {
            i if i < VRINGS => Ok(i),
            _ => Err(refused(format!(
                "vring {index}: this device has queues 0 to {}",
                VRINGS - 1
            ))),
        }
    }

    /// A frontend virtual address (how `SET_VRING_ADDR` names the rings) as a guest address.
    fn gpa(&self, va: u64, len: u64) -> Result<GuestAddress, RequestError> {
        self.regions
            .iter()
            .find(|r| va >= r.uaddr && va - r.uaddr < r.size && len <= r.size - (va - r.uaddr))
            .map(|r| GuestAddress(r.gpa + (va - r.uaddr)))
            .ok_or_else(|| refused(format!("ring address {va:#x} is in no memory region")))
    }

    fn apply(&mut self, m: &mut Msg) -> Result<Answer, RequestError> {
        let Ok(req) = FrontendReq::try_from(m.req) else {
            return Err(refused(format!("unknown request {}", m.req)));
        };
        // Anything but a question may change the plane's queue or the memory it lies in: the
        // plane leaves it first, and the DPU process lends it again once the device runs.
        let question = matches!(
            req,
            FrontendReq::GET_FEATURES
                | FrontendReq::GET_PROTOCOL_FEATURES
                | FrontendReq::GET_QUEUE_NUM
        );
        if question {
            return self.apply_question(req);
        }
        self.dev.begin_change();
        let r = self.apply_change(req, m);
        self.dev.end_change();
        r
    }

    fn apply_question(&mut self, req: FrontendReq) -> Result<Answer, RequestError> {
        let u64_reply = |v: u64| Answer::Reply(v.to_le_bytes().to_vec());
        match req {
            FrontendReq::GET_FEATURES => Ok(u64_reply(FEATURES)),
            FrontendReq::GET_PROTOCOL_FEATURES => Ok(u64_reply(PROTOCOL_FEATURES)),
            FrontendReq::GET_QUEUE_NUM => Ok(u64_reply(QUEUE_PAIRS as u64)),
            other => Err(refused(format!("request {other:?} is not a question"))),
        }
    }

    fn apply_change(&mut self, req: FrontendReq, m: &mut Msg) -> Result<Answer, RequestError> {
        match req {
            FrontendReq::SET_FEATURES => {
                let f = m.u64()?;
                if f & !FEATURES != 0 {
                    return Err(refused(format!(
                        "features {f:#x} include some not offered ({FEATURES:#x})"
                    )));
                }
                if f & (1 << VIRTIO_F_VERSION_1) == 0 {
                    return Err(refused(
                        "a driver without VIRTIO_F_VERSION_1 (legacy virtio)",
                    ));
                }
                self.acked = Some(f);
                self.dev.acked.store(f, Ordering::Relaxed);
                // A ring started before the features (QEMU starts them after) takes them too.
                for i in 0..VRINGS {
                    self.dev.vring(i).take_features(f);
                }
                // Without the protocol features every ring is enabled as it starts.
                if f & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() == 0 {
                    for i in 0..VRINGS {
                        self.dev.vring(i).enabled = true;
                    }
                }
                self.dev.bump();
                Ok(Answer::None)
            }
            FrontendReq::SET_PROTOCOL_FEATURES => {
                let f = m.u64()?;
                if f & !PROTOCOL_FEATURES != 0 {
                    return Err(refused(format!(
                        "protocol features {f:#x} include some not offered ({PROTOCOL_FEATURES:#x})"
                    )));
                }
                self.protocol = f;
                Ok(Answer::None)
            }
            FrontendReq::SET_OWNER => Ok(Answer::None),
            FrontendReq::RESET_OWNER => {
                self.dev.reset();
                self.regions.clear();
                Ok(Answer::None)
            }
            FrontendReq::SET_MEM_TABLE => self.set_mem_table(m).map(|()| Answer::None),
            FrontendReq::SET_VRING_NUM => {
                let (i, num) = m.vring_state()?;
                let i = self.ring(i)?;
                let size = u16::try_from(num)
                    .ok()
                    .filter(|n| n.is_power_of_two() && *n <= QUEUE_MAX);
                let size = size.ok_or_else(|| {
                    refused(format!(
                        "vring {i} size {num}: a power of two up to {QUEUE_MAX}"
                    ))
                })?;
                let mut v = self.dev.vring(i);
                v.queue.set_size(size);
                Ok(Answer::None)
            }
            FrontendReq::SET_VRING_ADDR => {
                let b = m.body_of(40)?;
                let (i, flags) = (le_u32(b, 0), le_u32(b, 4));
                let (desc, used, avail) = (le_u64(b, 8), le_u64(b, 16), le_u64(b, 24));
                let i = self.ring(i)?;
                if flags != 0 {
                    return Err(refused(format!(
                        "vring {i} address flags {flags:#x} (logging is not offered)"
                    )));
                }
                let size = u64::from(self.dev.vring(i).queue.size());
                let desc = self.gpa(desc, 16 * size)?;
                let avail = self.gpa(avail, 6 + 2 * size)?;
                let used = self.gpa(used, 6 + 8 * size)?;
                let mut v = self.dev.vring(i);
                let q = &mut v.queue;
                q.try_set_desc_table_address(desc)
                    .and_then(|()| q.try_set_avail_ring_address(avail))
                    .and_then(|()| q.try_set_used_ring_address(used))
                    .map_err(|e| refused(format!("vring {i} addresses: {e}")))?;
                Ok(Answer::None)
            }
            FrontendReq::SET_VRING_BASE => {
                let (i, base) = m.vring_state()?;
                let i = self.ring(i)?;
                let base = u16::try_from(base)
                    .map_err(|_| refused(format!("vring {i} base {base} is over 65535")))?;
                let mut v = self.dev.vring(i);
                v.queue.set_next_avail(base);
                v.queue.set_next_used(base);
                Ok(Answer::None)
            }
            FrontendReq::GET_VRING_BASE => {
                let (i, _) = m.vring_state()?;
                let i = self.ring(i)?;
                // The frontend stops the ring with this request: the data path leaves it.
                let base = {
                    let mut v = self.dev.vring(i);
                    v.queue.set_ready(false);
                    v.kick = None;
                    v.queue.next_avail()
                };
                self.dev.bump();
                let mut body = (i as u32).to_le_bytes().to_vec();
                body.extend_from_slice(&u32::from(base).to_le_bytes());
                Ok(Answer::Reply(body))
            }
            FrontendReq::SET_VRING_KICK
            | FrontendReq::SET_VRING_CALL
            | FrontendReq::SET_VRING_ERR => {
                let v = m.u64()?;
                let i = self.ring((v & 0xff) as u32)?;
                let no_fd = v & (1 << 8) != 0;
                let mut fds = m.take_fds(1)?;
                let fd = match (no_fd, fds.pop()) {
                    (false, Some(fd)) => Some(fd),
                    (true, None) => None,
                    (false, None) => return Err(refused(format!("vring {i}: no fd attached"))),
                    (true, Some(_)) => {
                        return Err(refused(format!("vring {i}: an fd with the no-fd flag")));
                    }
                };
                self.set_vring_fd(req, i, fd)?;
                Ok(Answer::None)
            }
            FrontendReq::SET_VRING_ENABLE => {
                // QEMU 7.2 sends this before SET_FEATURES (when the guest's driver sets its
                // queue pairs), so it is taken whenever the protocol features were offered.
                let (i, on) = m.vring_state()?;
                let i = self.ring(i)?;
                let on = match on {
                    0 => false,
                    1 => true,
                    n => return Err(refused(format!("vring {i} enable = {n}"))),
                };
                self.dev.vring(i).enabled = on;
                self.dev.bump();
                Ok(Answer::None)
            }
            other => Err(refused(format!(
                "request {other:?} is not served by this backend"
            ))),
        }
    }

    fn set_vring_fd(
        &mut self,
        req: FrontendReq,
        i: usize,
        fd: Option<OwnedFd>,
    ) -> Result<(), RequestError> {
        let bell = fd
            .map(|fd| Doorbell::from_fd(fd).map(Arc::new))
            .transpose()
            .map_err(|e| refused(format!("vring {i} eventfd: {e}")))?;
        let mut v = self.dev.vring(i);
        match req {
            FrontendReq::SET_VRING_KICK => {
                // The ring starts with its kick fd (the protocol's rule); it must lie in the
                // guest's memory to run.
                let mem = self.dev.mem.memory();
                v.kick = bell;
                v.take_features(self.dev.acked.load(Ordering::Relaxed));
                v.queue.set_ready(true);
                if !v.queue.is_valid(&*mem) {
                    v.queue.set_ready(false);
                    return Err(refused(format!(
                        "vring {i} does not lie in the guest's memory"
                    )));
                }
                // The data path polls; it asks for kicks only before it sleeps.
                let _ = v.queue.disable_notification(&*mem);
            }
            FrontendReq::SET_VRING_CALL => v.call = bell,
            _ => {}
        }
        drop(v);
        self.dev.bump();
        Ok(())
    }

    fn set_mem_table(&mut self, m: &mut Msg) -> Result<(), RequestError> {
        let b = &m.body;
        if b.len() < 8 {
            return Err(MsgError::BodySize {
                req: m.req,
                got: b.len(),
                want: 8,
            }
            .into());
        }
        let n = le_u32(b, 0) as usize;
        if n == 0 || n > REGIONS_MAX {
            return Err(refused(format!(
                "{n} memory regions, 1 to {REGIONS_MAX} taken"
            )));
        }
        m.body_of(8 + 32 * n)?;
        let fds = m.take_fds(n)?;
        if fds.len() != n {
            return Err(refused(format!("{n} memory regions but {} fds", fds.len())));
        }
        let mut regions = Vec::with_capacity(n);
        let mut mapped = Vec::with_capacity(n);
        let mut table = Vec::with_capacity(n);
        let mut total = 0u64;
        for (k, fd) in fds.into_iter().enumerate() {
            let o = 8 + 32 * k;
            let r = Region {
                gpa: le_u64(&m.body, o),
                size: le_u64(&m.body, o + 8),
                uaddr: le_u64(&m.body, o + 16),
            };
            let offset = le_u64(&m.body, o + 24);
            total = total.saturating_add(r.size);
            if r.size == 0
                || total > MEMORY_MAX
                || r.gpa.checked_add(r.size).is_none()
                || r.uaddr.checked_add(r.size).is_none()
            {
                return Err(refused(format!(
                    "memory region {k}: {r:?} (at most {MEMORY_MAX} bytes in all)"
                )));
            }
            let region = GuestRegion {
                gpa: r.gpa,
                size: r.size,
                offset,
            };
            let kept = fd
                .try_clone()
                .map_err(|e| refused(format!("memory region {k}: dup: {e}")))?;
            let mapped_region = map_region(k, region, fd).map_err(refused)?;
            table.push(TableRegion { region, fd: kept });
            let region = mapped_region;
            regions.push(r);
            mapped.push(region);
        }
        mapped.sort_by_key(|r| r.start_addr());
        let mem = GuestMemoryMmap::from_regions(mapped)
            .map_err(|e| refused(format!("memory table: {e}")))?;
        self.dev.mem.lock().expect("memory lock").replace(mem);
        table.sort_by_key(|t| t.region.gpa);
        *self.dev.table.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(table);
        self.regions = regions;
        self.dev.counters.mem_tables.fetch_add(1, Ordering::Relaxed);
        self.dev.bump();
        Ok(())
    }
}

/// A memory region's fd must be sealed against shrinking and hold `offset + size` bytes: a
/// VMM that truncated it under the mapping would fault the DPU process.
pub(crate) fn check_sealed(fd: BorrowedFd<'_>, offset: u64, size: u64) -> Result<(), String> {
    let seals = rustix::fs::fcntl_get_seals(fd)
        .map_err(|e| format!("F_GET_SEALS: {e} (a memfd is needed: memory-backend-memfd)"))?;
    if !seals.contains(rustix::fs::SealFlags::SHRINK) {
        return Err(
            "the memfd is not sealed against shrinking (F_SEAL_SHRINK; QEMU: seal=on)".into(),
        );
    }
    let st = rustix::fs::fstat(fd).map_err(|e| format!("fstat: {e}"))?;
    let need = offset.checked_add(size).ok_or("offset + size overflows")?;
    if (st.st_size as u64) < need {
        return Err(format!(
            "the file holds {} bytes, {need} are mapped",
            st.st_size
        ));
    }
    Ok(())
}
