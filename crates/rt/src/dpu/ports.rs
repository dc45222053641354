//! The DPU process's ports: the TAPs and shared-memory VM queues frames come and go by. It owns
//! [`DataPath`] (every [`Port`], the TAPs' places in the io_uring, the vATC authority over the
//! attached VMs' memory, and the driver's counters, [`RtCounters`]), writing a frame out of a
//! port, attaching and detaching shared-memory ports (with their budgets and quarantine), and
//! putting the TAPs into one io_uring at start. What the DPU decides about a frame is the core's
//! `DpuSwitch`, and reading the ports in turn is the daemon's loop (`daemon.rs`); the plane hears
//! of port changes through [`DataPath::vm_changes`], which the daemon drains.

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Child;

use spillway_fabric::atc::{RegionTable, VmId};
use spillway_vswitch::{Instant, PacketBuf, PortId};

use std::sync::Arc;

use crate::dpu::vmport::{self, ShmPort};
use crate::host::tap::Tap;
use crate::host::tap_uring::{TapTx, TapUring};
use crate::host::vnet::VnetHdr;
use crate::shm::ring::Doorbell;
use crate::vm::qemu::QemuGuest;
use crate::vm::vhost_user::conn::Backend;
use crate::vm::vhost_user::device::{self as vdev, ChainError, Device, TableRegion};
use crate::vm::vhost_user::lend::{self, GuestRegion, RingSpec};

/// How long a port detached for what its VM did (a broken queue, [`vmport::Misbehaviour`])
/// refuses a new attach, ns: a VM that reconnects at once to misbehave again costs the loop an attach a second.
const QUARANTINE_NS: u64 = 1_000_000_000;

/// The largest frame a port carries: a 64 KiB GSO frame with its Ethernet and VLAN headers
/// (its virtio-net header, where it has one, comes on top).
pub(super) const FRAME_MAX: usize = spillway_fabric::frame::FRAME_MAX;

/// How long an endpoint that connected may take to send its attach message, ns.
const ATTACH_WAIT_NS: u64 = 2_000_000_000;

/// Each TAP in the ring reads into twice this many buffers of its own (with multishot reads;
/// with armed reads, at most this many are armed), so one TAP gives a loop turn a bounded
/// number of frames. 32 measured as well as 64 (docs/adr/0005-tap-io.md).
pub(super) const TAP_RING_READS: usize = 32;

/// Transmit buffers of the ring: writes a loop turn may queue before its `enter`.
pub(super) const TAP_RING_TX: usize = 256;

spillway_vswitch::counters! {
    /// Driver counters (`rt.*`): what it moved and could not move. What became of each frame
    /// inside the DPU is the node's ([`spillway_fabric::frame::FrameCounters`], also under `rt.`).
    #[derive(Copy, PartialEq, Eq)]
    pub struct RtCounters {
        /// Frames read from the TAPs.
        rx_frames => "rt.rx.frames",
        /// Frames written to the TAPs.
        tx_frames => "rt.tx.frames",
        /// TAP writes that failed (the VM's queue was full, or it is gone).
        tx_errors => "rt.tx.errors",
        /// Frames shorter than their virtio-net header.
        drop_vnet_hdr => "rt.drop.vnet_hdr",
        /// Frames steered while no plane was connected.
        drop_plane_gone => "rt.drop.plane_gone",
        /// Frames sent to the spill plane.
        steered => "rt.steered.frames",
        /// Frames the plane sent back.
        from_plane => "rt.from_plane.frames",
        /// Spill-plane processes started.
        plane_starts => "rt.plane.starts",
        /// Plane processes that died or broke the protocol.
        plane_failures => "rt.plane.failures",
        /// Conntrack changes from a plane that is not the active one (a warm plane owns
        /// nothing; a fenced one no longer does), not taken.
        plane_ct_fenced => "rt.plane.ct_fenced",
        /// Frames a failed plane never took from its phy ring, taken back and offered to the
        /// DPU again.
        plane_reclaimed => "rt.plane.reclaimed",
        /// Frames a failed plane left in its phy ring beyond what is taken back, dropped.
        plane_reclaim_dropped => "rt.plane.reclaim_dropped",
        /// Shared-memory VM ports attached (endpoint connected).
        vm_attached => "rt.vm.attached",
        /// Shared-memory VM ports detached (endpoint gone or queue broken).
        vm_detached => "rt.vm.detached",
        /// Frames for a shared-memory or vhost-user VM that had no receive buffer posted.
        vm_rx_no_buffer => "rt.vm.rx.no_buffer",
        /// GSO super-frames taken from vhost-user guests (`HOST_TSO4/6`).
        vm_from_guest_gso => "rt.vm.from_guest.gso",
        /// GSO super-frames written whole into vhost-user guests (`GUEST_TSO4/6`).
        vm_to_guest_gso => "rt.vm.to_guest.gso",
        /// Frames written into a vhost-user guest across several of its receive buffers
        /// (`MRG_RXBUF`).
        vm_to_guest_merged => "rt.vm.to_guest.merged",
        /// Frames for a vhost-user guest that did not take the GSO kind they are (no
        /// `GUEST_TSO4/6`), or with a partial checksum that could not be completed, dropped.
        vm_rx_offload_refused => "rt.vm.rx.offload_refused",
        /// Descriptors (descriptor chains, on a vhost-user port) of a VM refused (bad address,
        /// flags, size, a loop).
        vm_desc_bad => "rt.vm.desc.bad",
        /// Loop turns in which a VM's transmit queue hit the bad descriptor budget
        /// ([`vmport::BAD_DESC_PER_TURN`]) and was left for the next turn.
        vm_desc_turn_budget => "rt.vm.desc.turn_budget",
        /// Bytes VMs wrote on their port sockets after attaching (the protocol has them write
        /// none).
        vm_socket_bytes => "rt.vm.socket.bytes",
        /// Ports detached because the endpoint closed its socket.
        vm_detached_gone => "rt.vm.detached.gone",
        /// Ports detached because the VM broke a queue (an index or id out of range).
        vm_detached_broken => "rt.vm.detached.broken",
        /// Ports detached for too many bad descriptors ([`vmport::BAD_DESC_WINDOW_MAX`] in
        /// [`vmport::BAD_DESC_WINDOW_NS`]).
        vm_detached_bad_desc => "rt.vm.detached.bad_desc",
        /// Ports detached for writing more than [`vmport::SOCKET_BYTES_MAX`] on their socket.
        vm_detached_socket_flood => "rt.vm.detached.socket_flood",
        /// Manage ticks in which a port detached for misbehaviour left a waiting connection
        /// unaccepted (`QUARANTINE_NS`, 1 s).
        vm_attach_quarantined => "rt.vm.attach.quarantined",
        /// vATC translation requests from the plane answered.
        atc_requests => "rt.atc.requests",
        /// vATC invalidations sent to the plane (a VM's memory changed).
        atc_invalidations => "rt.atc.invalidations",
        /// Connections to the vNIC socket refused (not the plane we started, or a wrong handshake
        /// secret).
        vnic_rejected => "rt.vnic.rejected",
        /// Connections to a VM port socket refused (a uid the testbed does not name for that VM).
        vm_rejected => "rt.vm.rejected",
    }
}

/// A VM port: its tenant and how its frames come and go.
#[derive(Debug)]
pub(super) struct Port {
    pub(super) id: PortId,
    pub(super) io: PortIo,
    /// A TAP port's file in the io_uring (`testbed.tap_io = "io_uring"`), if the ring runs.
    pub(super) file: Option<usize>,
}

#[derive(Debug)]
pub(super) enum PortIo {
    /// A TAP this process holds.
    Tap(Tap),
    /// A shared-memory port, attached while its endpoint is connected.
    Shm(Box<ShmSlot>),
    /// A QEMU guest's virtio-net device, served as its vhost-user backend.
    VhostUser(Box<VhostSlot>),
}

/// A vhost-user port's place: the backend (its service thread holds the socket and applies
/// QEMU's requests to the device), the guest this process started (if it did), and the copies
/// of the transmit queues' kick fds the loop polls.
#[derive(Debug)]
pub(super) struct VhostSlot {
    pub(super) vm: String,
    pub(super) backend: Backend,
    pub(super) guest: Option<QemuGuest>,
    /// The device generation `kicks` were taken at.
    pub(super) seen: u64,
    pub(super) kicks: [Option<Arc<Doorbell>>; vdev::TXS.len()],
    /// Which transmit queue [`vdev::recv`] reads first next.
    pub(super) tx_turn: usize,
    /// The guest's receive queue 1 as lent to the spill plane, if it is.
    pub(super) lent: Option<Lent>,
    /// Lends so far (the next lend's number follows).
    pub(super) lends: u32,
    /// The guest's bad-chain budget (the same rule as a shared-memory port's).
    pub(super) budget: vmport::DescBudget,
}

/// A lend of a guest's receive queue 1 to the spill plane: what the plane is sent with it.
#[derive(Debug)]
pub(super) struct Lent {
    pub(super) number: u32,
    pub(super) features: u64,
    pub(super) ring: RingSpec,
    pub(super) call: Arc<Doorbell>,
    pub(super) table: Arc<Vec<TableRegion>>,
}

impl VhostSlot {
    pub(super) fn dev(&self) -> &Device {
        &self.backend.dev
    }
}

/// A shared-memory VM port's place: its socket, the attached port, the bridge endpoint this
/// process started (if it did).
#[derive(Debug)]
pub(super) struct ShmSlot {
    pub(super) vm: String,
    pub(super) listener: UnixListener,
    pub(super) port: Option<ShmPort>,
    /// A connection whose attach message has not arrived yet, and when it was accepted.
    pub(super) pending: Option<(UnixStream, Instant)>,
    pub(super) bridge: Option<Child>,
    /// The uid allowed to attach (`[[vm]] uid`); the bridge this process started is allowed too.
    pub(super) uid: u32,
    /// Detached for misbehaviour: no new attach before this time.
    pub(super) quarantine_until: Option<Instant>,
}

/// Why a shared-memory port was detached (each counted as `rt.vm.detached.<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DetachReason {
    /// The endpoint closed its socket (or the socket failed).
    Gone,
    /// The VM published an index or id out of range: the queue is unusable.
    Broken,
    /// The VM went over a budget ([`vmport::Misbehaviour`]).
    Misbehaved(vmport::Misbehaviour),
}

impl DetachReason {
    fn name(self) -> &'static str {
        match self {
            DetachReason::Gone => "gone",
            DetachReason::Broken => "broken",
            DetachReason::Misbehaved(m) => m.name(),
        }
    }
}

/// Whether the `n`th refusal of a kind is logged: the 1st, 2nd, 4th, 8th, ... A peer that
/// connects in a loop costs a counter increment, not a log line per attempt; the counter
/// (`rt.vnic.rejected`, `rt.vm.rejected`) has the exact number.
pub(crate) fn worth_logging(n: u64) -> bool {
    n.is_power_of_two()
}

/// A change of a shared-memory port that the spill plane must hear of.
#[derive(Clone, Copy, Debug)]
pub(super) enum VmChange {
    Attached(PortId),
    Detached(PortId),
}

/// The virtio-net header a TAP gets for a frame that came with `vnet`: the same offloads, or
/// none if `vnet` does not parse.
pub(super) fn tap_hdr(vnet: &[u8]) -> [u8; VnetHdr::LEN] {
    match VnetHdr::parse(vnet) {
        Ok(h) => h.to_bytes(),
        Err(_) => VnetHdr::NONE.to_bytes(),
    }
}

/// The vATC's name for a port's VM.
pub(super) fn vm_id(port: PortId) -> VmId {
    VmId(port.0)
}

/// The ports' side of the data path: the TAPs and shared-memory queues frames come and go by,
/// and what the driver counts of moving them. (The DPU itself, model and vSwitch, is the
/// core's [`DpuSwitch`](spillway_fabric::frame::DpuSwitch), beside this.)
#[derive(Debug)]
pub(super) struct DataPath {
    pub(super) ports: Vec<Port>,
    /// The port slot of each file in the TAP ring.
    pub(super) tap_slots: Vec<usize>,
    pub(super) port_index: BTreeMap<PortId, usize>,
    pub(super) vnet_hdr: bool,
    pub(super) counters: RtCounters,
    /// The vATC authority: the registered memory of every attached shared-memory VM.
    pub(super) authority: RegionTable,
    /// Port changes not yet told to the plane.
    pub(super) vm_changes: Vec<VmChange>,
    /// Where a frame's partial checksum is completed before it goes to a guest that takes
    /// none (allocated once).
    pub(super) scratch: Box<[u8]>,
}

impl DataPath {
    pub(super) fn port_slot(&self, id: PortId) -> Option<usize> {
        self.port_index.get(&id).copied()
    }

    /// Sends `frame` (with virtio-net header `vnet`) out of `port`: through the io_uring `tx`
    /// when the port is a TAP in it, else by a system call or into the VM's queue.
    pub(super) fn write_port(
        &mut self,
        now: Instant,
        tx: Option<&mut TapTx>,
        port: PortId,
        vnet: &[u8],
        frame: &[u8],
    ) {
        let Some(i) = self.port_slot(port) else {
            self.counters.tx_errors += 1;
            return;
        };
        let r = match (&self.ports[i].io, self.ports[i].file.zip(tx)) {
            (PortIo::Tap(_), Some((file, tx))) => {
                let hdr = tap_hdr(vnet);
                let hdr: &[u8] = if self.vnet_hdr { &hdr } else { &[] };
                tx.write(file, [hdr, frame])
            }
            _ => self.write_io(now, i, vnet, frame),
        };
        self.count_write(r);
    }

    /// [`DataPath::write_port`] of the frame in `pkt`: to a TAP in the ring, out of the buffer
    /// it is in when that is the frame the ring is handing out ([`TapTx::send_in_place`]), with
    /// no copy; otherwise as [`DataPath::write_port`] does.
    pub(super) fn write_port_buf(
        &mut self,
        now: Instant,
        tx: Option<&mut TapTx>,
        port: PortId,
        vnet: &[u8],
        pkt: &mut PacketBuf,
    ) {
        let ring = self
            .port_slot(port)
            .filter(|&i| matches!(self.ports[i].io, PortIo::Tap(_)))
            .and_then(|i| self.ports[i].file);
        match (ring, tx) {
            (Some(file), Some(tx)) => {
                let hdr = tap_hdr(vnet);
                let hdr: &[u8] = if self.vnet_hdr { &hdr } else { &[] };
                let r = tx.send_in_place(file, hdr, pkt) || tx.write(file, [hdr, pkt.data()]);
                self.count_write(r);
            }
            (_, tx) => self.write_port(now, tx, port, vnet, pkt.data()),
        }
    }

    fn count_write(&mut self, written: bool) {
        if written {
            self.counters.tx_frames += 1;
        } else {
            self.counters.tx_errors += 1;
        }
    }

    /// [`DataPath::write_port`] without the ring: a system call for a TAP, a copy into the
    /// VM's receive queue for a shared-memory port.
    fn write_io(&mut self, now: Instant, i: usize, vnet: &[u8], frame: &[u8]) -> bool {
        match &mut self.ports[i].io {
            PortIo::Tap(tap) if self.vnet_hdr => match VnetHdr::parse(vnet) {
                Ok(h) => tap.write_vectored(&h, frame).is_ok(),
                Err(_) => tap.write_vectored(&VnetHdr::NONE, frame).is_ok(),
            },
            PortIo::Tap(tap) => tap.write(frame).is_ok(),
            PortIo::VhostUser(slot) => {
                let h = VnetHdr::parse(vnet).unwrap_or(VnetHdr::NONE);
                let acked = slot.dev().acked.load(std::sync::atomic::Ordering::Relaxed);
                let r = match vdev::to_guest(acked, &h) {
                    vdev::ToGuest::As(out) => {
                        let r = vdev::send(slot.dev(), &out.to_bytes(), frame);
                        if out.gso_type != VnetHdr::GSO_NONE && r.is_ok_and(|n| n > 0) {
                            self.counters.vm_to_guest_gso += 1;
                        }
                        r
                    }
                    vdev::ToGuest::Refuse => {
                        self.counters.vm_rx_offload_refused += 1;
                        return false;
                    }
                    vdev::ToGuest::CompleteChecksum => {
                        let n = frame.len();
                        let done = self.scratch.get_mut(..n).is_some_and(|b| {
                            b.copy_from_slice(frame);
                            crate::host::vnet::complete_checksum(b, &h).is_ok()
                        });
                        if !done {
                            self.counters.vm_rx_offload_refused += 1;
                            return false;
                        }
                        let out = VnetHdr {
                            num_buffers: 1,
                            ..VnetHdr::NONE
                        };
                        vdev::send(slot.dev(), &out.to_bytes(), &self.scratch[..n])
                    }
                };
                self.vhost_sent(i, r)
            }
            PortIo::Shm(slot) => {
                let hdr: &[u8] = if vnet.len() == VnetHdr::LEN {
                    vnet
                } else {
                    &[0u8; VnetHdr::LEN]
                };
                match slot.port.as_mut().map(|p| p.send(hdr, frame)) {
                    Some(Ok(sent)) => sent,
                    Some(Err(e)) => {
                        tracing::warn!(target: "spillway::run", vm = %slot.vm, error = %e, "VM receive queue broken; detaching the port");
                        self.detach(i, now, DetachReason::Broken);
                        false
                    }
                    None => false,
                }
            }
        }
    }

    /// What became of a frame sent into vhost-user port slot `i`'s receive queue.
    fn vhost_sent(&mut self, i: usize, r: Result<usize, ChainError>) -> bool {
        match r {
            Ok(0) => {
                self.counters.vm_rx_no_buffer += 1;
                false
            }
            Ok(1) => true,
            Ok(_) => {
                self.counters.vm_to_guest_merged += 1;
                true
            }
            Err(ChainError::Bad(_)) => {
                self.counters.vm_desc_bad += 1;
                if let PortIo::VhostUser(slot) = &mut self.ports[i].io {
                    slot.budget.note_bad();
                }
                false
            }
            Err(ChainError::Broken) => {
                self.vhost_broken(i);
                false
            }
        }
    }

    /// The guest of vhost-user port slot `i` broke a queue: the frontend is disconnected (the
    /// device resets; QEMU connects again after the quarantine).
    pub(super) fn vhost_broken(&mut self, i: usize) {
        if let PortIo::VhostUser(slot) = &self.ports[i].io {
            tracing::warn!(target: "spillway::run", vm = %slot.vm, "the guest broke a virtqueue; vhost-user port reset");
            slot.backend.disconnect();
            self.counters.vm_detached += 1;
            self.counters.vm_detached_broken += 1;
        }
    }

    /// Detaches shared-memory port slot `i` for `why` at `now`: its memory leaves the authority
    /// (which bumps the VM's epoch) and the plane is told to invalidate. A port detached for
    /// what its VM did (a broken queue, a budget) takes no new attach for [`QUARANTINE_NS`].
    pub(super) fn detach(&mut self, i: usize, now: Instant, why: DetachReason) {
        let id = self.ports[i].id;
        if let PortIo::Shm(slot) = &mut self.ports[i].io
            && let Some(p) = slot.port.take()
        {
            self.counters.vm_rx_no_buffer += p.rx_no_buffer;
            self.counters.vm_desc_bad += p.bad_desc;
            self.counters.vm_desc_turn_budget += p.turn_budget_hits;
            self.counters.vm_socket_bytes += p.socket_bytes;
            self.counters.vm_detached += 1;
            let c = &mut self.counters;
            *match why {
                DetachReason::Gone => &mut c.vm_detached_gone,
                DetachReason::Broken => &mut c.vm_detached_broken,
                DetachReason::Misbehaved(vmport::Misbehaviour::BadDescriptors) => {
                    &mut c.vm_detached_bad_desc
                }
                DetachReason::Misbehaved(vmport::Misbehaviour::SocketFlood) => {
                    &mut c.vm_detached_socket_flood
                }
            } += 1;
            if why != DetachReason::Gone {
                slot.quarantine_until = Some(Instant(now.0.saturating_add(QUARANTINE_NS)));
                tracing::warn!(target: "spillway::run", vm = %slot.vm, reason = why.name(), bad_desc = p.bad_desc, socket_bytes = p.socket_bytes, "shared-memory port detached: the VM went over its budget");
            } else {
                tracing::info!(target: "spillway::run", vm = %slot.vm, reason = why.name(), "shared-memory port detached");
            }
            self.authority.remove_vm(vm_id(id));
            self.vm_changes.push(VmChange::Detached(id));
        }
    }

    /// Detaches slot `i` if its VM went over a budget.
    pub(super) fn detach_if_misbehaving(&mut self, i: usize, now: Instant) {
        match &mut self.ports[i].io {
            PortIo::Shm(slot) => {
                if let Some(m) = slot.port.as_ref().and_then(ShmPort::misbehaving) {
                    self.detach(i, now, DetachReason::Misbehaved(m));
                }
            }
            PortIo::VhostUser(slot) => {
                if slot.budget.misbehaving().is_some() {
                    // The frontend is disconnected and quarantined; the budget starts again
                    // with its next connection.
                    tracing::warn!(target: "spillway::run", vm = %slot.vm, "the guest posted too many bad descriptor chains; vhost-user port reset");
                    slot.backend.disconnect();
                    slot.budget = vmport::DescBudget::default();
                    self.counters.vm_detached += 1;
                    self.counters.vm_detached_bad_desc += 1;
                }
            }
            PortIo::Tap(_) => {}
        }
    }

    /// Attaches `port` to shared-memory slot `i`: registers its buffer areas with the authority.
    fn attach(&mut self, i: usize, port: ShmPort) -> Result<(), String> {
        let id = self.ports[i].id;
        let vm = vm_id(id);
        self.authority.remove_vm(vm);
        for m in vmport::regions(port.mem.layout()) {
            self.authority.map(vm, m).map_err(|e| e.to_string())?;
        }
        if let PortIo::Shm(slot) = &mut self.ports[i].io {
            slot.port = Some(port);
            self.counters.vm_attached += 1;
            self.vm_changes.push(VmChange::Attached(id));
            tracing::info!(target: "spillway::run", vm = %slot.vm, epoch = self.authority.epoch(vm).0, "shared-memory port attached");
        }
        Ok(())
    }

    /// Interrupts every shared-memory or vhost-user VM that got frames (or buffers back) this
    /// turn.
    pub(super) fn flush_irqs(&mut self) {
        for p in &mut self.ports {
            match &mut p.io {
                PortIo::Shm(slot) => {
                    if let Some(port) = slot.port.as_mut() {
                        port.flush_irq();
                    }
                }
                PortIo::VhostUser(slot) => {
                    for q in [vdev::RX, vdev::TX, vdev::TX2] {
                        vdev::flush_irq(slot.dev(), q);
                    }
                }
                PortIo::Tap(_) => {}
            }
        }
    }

    pub(super) fn woke_ports(&mut self) {
        for p in &mut self.ports {
            match &mut p.io {
                PortIo::Shm(slot) => {
                    if let Some(port) = slot.port.as_mut() {
                        port.woke();
                    }
                }
                PortIo::VhostUser(slot) => {
                    let _ = slot.backend.dev.changed.drain();
                    vdev::woke(slot.dev());
                }
                PortIo::Tap(_) => {}
            }
        }
    }

    /// vhost-user port slot `i`, if its device changed since the last look: new copies of the
    /// kick fds, and its receive queue 1 lent to the plane again. A lend that held is over (the
    /// session took the queue back before the change): the guest's memory leaves the authority
    /// (its epoch moves) and the plane is told. Once the queue runs in a known memory table the
    /// table goes into the authority, regions end to end from host address 0
    /// ([`lend::authority_mappings`]), and the queue is lent under a new number.
    fn manage_vhost(&mut self, i: usize) {
        let id = self.ports[i].id;
        let PortIo::VhostUser(slot) = &mut self.ports[i].io else {
            return;
        };
        let dev = &slot.backend.dev;
        let g = dev.generation.load(std::sync::atomic::Ordering::Acquire);
        if g == slot.seen {
            return;
        }
        slot.seen = g;
        slot.kicks = vdev::tx_kicks(dev);
        let vm = vm_id(id);
        if slot.lent.take().is_some() {
            self.authority.remove_vm(vm);
            self.vm_changes.push(VmChange::Detached(id));
        }
        let table = dev.table();
        let Some((ring, call)) = dev.plane_ring().filter(|_| !table.is_empty()) else {
            return;
        };
        self.authority.remove_vm(vm);
        let regions: Vec<GuestRegion> = table.iter().map(|t| t.region).collect();
        for m in lend::authority_mappings(&regions) {
            if let Err(e) = self.authority.map(vm, m) {
                tracing::warn!(target: "spillway::run", vm = %slot.vm, error = %e, "guest memory table refused by the vATC authority");
                self.authority.remove_vm(vm);
                return;
            }
        }
        let number = slot.lends.wrapping_add(1);
        if !dev.lend_plane(g, number) {
            // The frontend changed something meanwhile: the next look lends again.
            self.authority.remove_vm(vm);
            return;
        }
        slot.lends = number;
        slot.lent = Some(Lent {
            number,
            features: dev.acked.load(std::sync::atomic::Ordering::Relaxed),
            ring,
            call,
            table,
        });
        self.vm_changes.push(VmChange::Attached(id));
        tracing::info!(target: "spillway::run", vm = %slot.vm, lend = number, epoch = self.authority.epoch(vm).0, "guest receive queue 1 lent to the spill plane");
    }

    /// Shared-memory ports: attaches an endpoint that connected, detaches one that went away.
    /// vhost-user ports: lends their receive queue 1 to the plane when it runs
    /// ([`Self::manage_vhost`]). The changes wait in `vm_changes` until the daemon tells the
    /// plane.
    pub(super) fn manage_ports(&mut self, now: Instant) {
        for i in 0..self.ports.len() {
            self.manage_vhost(i);
            let PortIo::Shm(slot) = &mut self.ports[i].io else {
                continue;
            };
            if slot.port.as_mut().is_some_and(|p| p.endpoint_gone()) {
                self.detach(i, now, DetachReason::Gone);
                continue;
            }
            // A flood on the socket (just read) or bad receive buffers (posted while frames
            // were sent to the VM) since the last turn.
            self.detach_if_misbehaving(i, now);
            let PortIo::Shm(slot) = &mut self.ports[i].io else {
                continue;
            };
            if slot.port.is_some() {
                continue;
            }
            if let Some(until) = slot.quarantine_until {
                if now < until {
                    // Waiting connections stay in the listener's backlog until then.
                    self.counters.vm_attach_quarantined += 1;
                    continue;
                }
                slot.quarantine_until = None;
            }
            let stream = match slot.pending.take() {
                Some((s, since)) if now.0.saturating_sub(since.0) < ATTACH_WAIT_NS => (s, since),
                Some(_) => {
                    tracing::warn!(target: "spillway::run", vm = %slot.vm, "an endpoint connected but sent no attach message; dropped");
                    continue;
                }
                None => match slot.listener.accept() {
                    Ok((s, _)) => {
                        // The uid the testbed names for this VM, or the bridge we started.
                        let bridge = slot.bridge.as_ref().map(Child::id);
                        match crate::host::unixsock::peer_cred(&s) {
                            Ok(c) if c.uid == slot.uid || Some(c.pid) == bridge => (s, now),
                            peer => {
                                self.counters.vm_rejected += 1;
                                if worth_logging(self.counters.vm_rejected) {
                                    let (pid, uid) = peer.map_or((0, u32::MAX), |c| (c.pid, c.uid));
                                    let rejected = self.counters.vm_rejected;
                                    tracing::warn!(target: "spillway::run", vm = %slot.vm, pid, uid, allowed_uid = slot.uid, rejected, "refused a VM port connection from another uid");
                                }
                                continue;
                            }
                        }
                    }
                    Err(_) => continue,
                },
            };
            match vmport::accept(stream.0) {
                Ok(vmport::Accepted::NotYet(s)) => slot.pending = Some((s, stream.1)),
                Ok(vmport::Accepted::Attached(port, name)) if name == slot.vm => {
                    if let Err(e) = self.attach(i, *port) {
                        tracing::warn!(target: "spillway::run", vm = %name, error = %e, "could not register the VM's memory");
                    }
                }
                Ok(vmport::Accepted::Attached(_, name)) => {
                    tracing::warn!(target: "spillway::run", expected = %slot.vm, got = %name, "an endpoint attached to another VM's port; refused");
                }
                Err(e) => {
                    tracing::warn!(target: "spillway::run", vm = %slot.vm, error = %e, "VM port attach failed");
                }
            }
        }
    }
}

/// Puts the TAP ports of `ports` into one io_uring and marks each with its file; returns the
/// ring and the port slot of each file. Where the kernel refuses the ring (an old kernel, a
/// sandbox without io_uring) the TAPs fall back to system calls, with a warning.
/// `vnet_hdr`: the TAPs carry a virtio-net header in front of every frame.
pub(super) fn tap_ring(ports: &mut [Port], vnet_hdr: bool) -> (Option<TapUring>, Vec<usize>) {
    let slots: Vec<usize> = ports
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p.io, PortIo::Tap(_)))
        .map(|(i, _)| i)
        .collect();
    if slots.is_empty() {
        return (None, slots);
    }
    let fds: Vec<BorrowedFd<'_>> = slots
        .iter()
        .filter_map(|&i| match &ports[i].io {
            PortIo::Tap(tap) => tap.as_fd(0),
            PortIo::Shm(_) | PortIo::VhostUser(_) => None,
        })
        .collect();
    let prefix = if vnet_hdr { VnetHdr::LEN } else { 0 };
    match TapUring::new(&fds, TAP_RING_READS, TAP_RING_TX, prefix, FRAME_MAX) {
        Ok(ring) => {
            for (file, &i) in slots.iter().enumerate() {
                ports[i].file = Some(file);
            }
            tracing::info!(target: "spillway::run", taps = slots.len(), reads = ?ring.read_mode(), "TAP I/O on io_uring");
            (Some(ring), slots)
        }
        Err(e) => {
            tracing::warn!(target: "spillway::run", error = %e, "io_uring refused; TAP I/O by system calls");
            (None, Vec::new())
        }
    }
}
