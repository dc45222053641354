//! The DPU process of `spillway run`: the emulated DPU in real time between the tenant VMs' TAP
//! devices, and the DPU end of the vNIC set towards the spill-plane process.
//!
//! The loop is the fabric core's polling order with real inputs:
//!
//! 1. frames from every TAP (a batch per port): each goes to the core's frame node
//!    ([`DpuSwitch::process`]), which decides with the DPU's limits in real time whether the
//!    hardware fast path or the SoC slow path delivers it (through the DPU's own vSwitch
//!    pipeline), whether a redirect rule steers it to the spill plane, or whether a limit drops
//!    it, and says which in one [`Outcome`]: this loop writes a forwarded frame to its port and
//!    a steered one, as it came, to the phy ring;
//! 2. frames back from the plane ([`DpuSwitch::process_from_plane`]: processed, sent on;
//!    punted, the slow path takes them);
//! 3. flow-ring and control records from the plane, handed to the node (which adopts the
//!    conntrack snapshots it should, so a connection handed back keeps its state);
//! 4. the core's timers, then its outputs: messages to the plane (the node has attached their
//!    snapshots), commands to start or stop the plane's process, lifecycle events (logged and
//!    kept for `ctl status`);
//! 5. the plane's process: accept its connection, notice its death (fail-open), reap it;
//! 6. `spillway ctl` requests and the metrics snapshot;
//! 7. sleep in `poll` on the TAPs, the doorbell and the sockets until the next timer.
//!
//! What the model charges but this driver does not emulate: latency. The DPU's limits (rates,
//! queues, table size, insertion budget, memory) are enforced on real frames as they arrive; a
//! frame the model admits is forwarded at once, not after the modelled service time.
//!
//! This file holds the loop and what it does per frame; the rest of the process lives beside it
//! in `dpu/`: its start ([`DpuDaemon::start`], `setup.rs`), its ports and the driver's counters
//! (`ports.rs`, an owned `DataPath`), the spill plane's process (`plane_proc.rs`) and what it
//! reports to `ctl` and `/metrics` (`report.rs`). Those add `impl DpuDaemon` blocks or own the
//! types the daemon holds; this file depends on them, never the other way round through
//! anything but [`DpuDaemon`] itself and its error type.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use spillway_fabric::dpu::DpuNode;
use spillway_fabric::dpu::{Command as DpuCommand, EventKind, FabricEvent};
use spillway_fabric::frame::{DpuModel, DpuSwitch, Outcome};
use spillway_fabric::types::{Msg, PlaneSlot};
use spillway_vswitch::{Instant, PacketBuf, PortId};

use crate::dpu::forward::{self, Forwarders, Links, Parcel};
use crate::dpu::plane_ctl::KeptFrames;
use crate::dpu::plane_proc::{PlaneProc, Retiring};
use crate::dpu::ports::{DataPath, DetachReason, PortIo};
use crate::dpu::shards::DpuResources;
use crate::dpu::vmport::Turn;
use crate::host::allocs;
use crate::host::cgroup::Cgroup;
use crate::host::clock::Clock;
use crate::host::ledger::Ledger;
use crate::host::signals;
use crate::host::tap_uring::{TapTx, TapUring};
use crate::host::vnet::VnetHdr;
use crate::ops::ctl::CtlServer;
use crate::ops::metrics::{MetricsServer, SnapshotPublisher};
pub(super) use crate::shards::{PUBLISH_NS, Spin};
use crate::shm::codec::VatcMsg;
use crate::shm::vnic::{CONTROL_STATS, Control, FlowRecord};
use crate::testbed::Testbed;
use crate::vm::vhost_user::device::{self as vdev, ChainError};

/// The driver's counters, kept with the ports they count (`ports.rs`); re-exported so that
/// their public path stays `dpu::daemon::RtCounters`.
pub use crate::dpu::ports::RtCounters;

/// Thread 0's frame node: the whole DPU model, or its control part and shard 0 with the other
/// shards on forwarding threads.
pub(super) type Switch = DpuSwitch<DpuNode<DpuResources>>;

/// Frames read from one port (TAP or shared-memory) per loop turn before the next port gets
/// its turn.
const TAP_BATCH: usize = 64;
/// Bytes read from one port per loop turn: after the frame that crosses it the next port gets
/// its turn, so a VM sending 64 KiB GSO frames holds the loop for 4 of them, not 64.
const PORT_BYTES_PER_TURN: usize = 256 << 10;
/// Records taken from a ring per loop turn.
const RING_BATCH: usize = 256;
/// Lifecycle events kept for `ctl status`.
const EVENTS_KEPT: usize = 64;

/// One activation, timed from its trigger (URSched's decision or the operator's command).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Activation {
    /// A plane had to be started (cold) rather than activated from shadow (warm).
    pub cold: bool,
    /// Trigger to redirect rules live, ms.
    pub rules_live_ms: Option<f64>,
    /// Trigger to the first redirected packet served by the plane (as the DPU heard of it), ms.
    pub first_packet_ms: Option<f64>,
}

/// Options of `spillway run`.
#[derive(Debug)]
pub struct RunOptions {
    /// The testbed.
    pub testbed: Testbed,
    /// The binary that runs `spill-plane` (this one).
    pub plane_exe: PathBuf,
    /// Written once the testbed is up (scripts wait for it).
    pub ready_file: Option<PathBuf>,
}

/// Errors of `spillway run`.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bringing the testbed up failed.
    #[error("testbed: {0}")]
    Setup(String),
    /// An I/O error in the loop.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// The error.
        source: io::Error,
    },
}

/// Wraps an I/O error with what was being done. `what` becomes a `String` only when there is
/// an error: `map_err(io_err(..))` builds this closure on every call, also on the hot path
/// (a TAP poll, an io_uring enter) where the call succeeds, and must not allocate there.
pub(super) fn io_err<W: Into<String>>(what: W) -> impl FnOnce(io::Error) -> RunError {
    move |source| RunError::Io {
        what: what.into(),
        source,
    }
}

/// What `spillway run` reports when it stops.
#[derive(Debug, serde::Serialize)]
pub struct RunReport {
    /// The process's counters at the end (`rt.*`: the driver's and the DPU node's).
    pub counters: BTreeMap<String, u64>,
    /// Activations seen.
    pub activations: Vec<Activation>,
    /// Objects the cleanup removed.
    pub cleaned: usize,
}

/// The processes in the plane slots, the active one first (the slot the redirect rules steer
/// to), then the other (the warm plane's, or a retiring one's).
pub(super) fn by_role(
    planes: &mut [Option<PlaneProc>; 2],
    active: PlaneSlot,
) -> (Option<&mut PlaneProc>, Option<&mut PlaneProc>) {
    let [p0, p1] = planes;
    let (a, w) = if active.index() == 0 {
        (p0, p1)
    } else {
        (p1, p0)
    };
    (a.as_mut(), w.as_mut())
}

/// Sends the node's messages to the active plane and to the warm one (their snapshots
/// attached), then rings their doorbells. With no plane connected in a slot its messages are
/// dropped: the model's fail-open (or the warm plane's restart) has them covered. An error
/// names the slot whose vNIC broke.
fn send_outgoing(
    sw: &mut Switch,
    planes: &mut [Option<PlaneProc>; 2],
    now: Instant,
) -> Result<(), (PlaneSlot, String)> {
    let active = sw.dpu().active_slot();
    let (a, w) = by_role(planes, active);
    let mut vnic = a.and_then(|p| p.vnic.as_mut());
    while let Some(o) = sw.poll_transmit(now) {
        if let Some(v) = vnic.as_deref_mut() {
            v.send_outgoing(&o).map_err(|e| (active, e.to_string()))?;
        }
    }
    let mut warm = w.and_then(|p| p.vnic.as_mut());
    while let Some(o) = sw.poll_warm_transmit(now) {
        if let Some(v) = warm.as_deref_mut() {
            v.send_outgoing(&o)
                .map_err(|e| (active.other(), e.to_string()))?;
        }
    }
    for v in [vnic, warm].into_iter().flatten() {
        v.kick();
    }
    Ok(())
}

/// Where a DPU thread's frames go once its node has decided: thread 0's ports and the plane's
/// vNIC ([`PortsOut`]), or a forwarding thread's TAP queues and thread 0
/// (`forward::ShardOut`).
pub(super) trait Egress {
    /// Out of `port`, from `pkt` (with no copy where the ring can send it from there).
    fn forward_buf(&mut self, now: Instant, port: PortId, vnet: &Vnet, pkt: &mut PacketBuf);
    /// Out of `port`, from `frame`.
    fn forward_bytes(&mut self, now: Instant, port: PortId, vnet: &[u8], frame: &[u8]);
    /// To the plane as it came from `port`, with the node's message; false if it could not go.
    fn steer(&mut self, msg: &Msg, port: PortId, vnet: &Vnet, frame: &[u8]) -> bool;
    /// To the thread of shard `to`, whose connection the frame is, as it came from `port`.
    fn hand_off(&mut self, to: usize, port: PortId, vnet: &Vnet, frame: &[u8]);
    /// Keeps a frame the node steered to a plane that is gone (killed, and the flip away from
    /// it under way; or, on a forwarding thread, a fail-open its view has not shown yet), to
    /// be offered again once the core takes re-offers; not a frame that is itself a re-offer.
    /// False if it cannot. The same rule on every thread: thread 0 keeps it itself, the others
    /// send it to thread 0.
    fn keep(&mut self, _port: PortId, _vnet: &Vnet, _frame: &[u8]) -> bool {
        false
    }
    /// The driver's counters.
    fn counters(&mut self) -> &mut RtCounters;
}

/// A virtio-net header.
pub(super) type Vnet = [u8; VnetHdr::LEN];

/// The GSO segment size a virtio-net header asks for (0: none, or a header that does not
/// parse).
pub(super) fn gso_size(vnet: &Vnet) -> u16 {
    VnetHdr::parse(vnet).map_or(0, |h| h.gso_segment())
}

/// The virtio-net header in front of the frame in `pkt` if the port has one (`has_hdr`),
/// taken off it, with the frame's GSO size set from it; `None` (counted) if the frame is too
/// short to have one.
pub(super) fn take_vnet(
    pkt: &mut PacketBuf,
    has_hdr: bool,
    counters: &mut RtCounters,
) -> Option<Vnet> {
    let mut vnet = PLAIN_VNET;
    if has_hdr {
        match pkt.prefix(VnetHdr::LEN) {
            Some(h) => vnet.copy_from_slice(h),
            None => {
                counters.drop_vnet_hdr += 1;
                return None;
            }
        }
    }
    pkt.set_gso_size(gso_size(&vnet));
    Some(vnet)
}

/// A VM's frame from `port`, in `pkt`, through a DPU node and on: out of a port (from `pkt`
/// itself where the ring can send it from there), or to the plane with the virtio-net header
/// it came with.
pub(super) fn offer_frame<M: DpuModel>(
    sw: &mut DpuSwitch<M>,
    out: &mut impl Egress,
    now: Instant,
    port: PortId,
    vnet: &Vnet,
    pkt: &mut PacketBuf,
) {
    match sw.process_in_place(now, port, pkt) {
        Outcome::Forward {
            port: to,
            generated,
            ..
        } => {
            let vnet = if generated { &PLAIN_VNET } else { vnet };
            out.forward_buf(now, to, vnet, pkt);
        }
        Outcome::Steer { msg } => {
            if out.steer(&msg, port, vnet, pkt.data()) {
                out.counters().steered += 1;
            } else if !out.keep(port, vnet, pkt.data()) {
                out.counters().drop_plane_gone += 1;
            }
        }
        Outcome::Elsewhere { shard } => out.hand_off(shard, port, vnet, pkt.data()),
        Outcome::Drop(why) => {
            tracing::debug!(target: "spillway::drop", ?why, len = pkt.len(), "the DPU dropped a frame");
        }
        other => {
            tracing::error!(target: "spillway::run", outcome = ?other, "a DPU outcome only the plane has");
        }
    }
}

/// Thread 0's way out: its ports (through the ring `tx` where they are in it) and the plane's
/// phy ring.
pub(super) struct PortsOut<'a> {
    pub(super) dp: &'a mut DataPath,
    pub(super) plane: Option<&'a mut PlaneProc>,
    pub(super) tx: Option<&'a mut TapTx>,
    /// The other forwarding threads, with `fabric.dpu.shards > 1`.
    pub(super) links: Option<&'a mut Links>,
    /// Where frames steered to a plane that is gone wait (see [`Egress::keep`]); none for
    /// frames from the plane, which are never steered.
    pub(super) kept: Option<&'a mut KeptFrames>,
    /// The frame is one taken back from a failed plane, offered again: it is not kept a
    /// second time, here or on the thread it is handed to.
    pub(super) reoffer: bool,
    /// A re-offered frame could not be handed to its thread (no buffer or no room there):
    /// the caller keeps it for a later turn.
    pub(super) refused: bool,
}

impl Egress for PortsOut<'_> {
    fn forward_buf(&mut self, now: Instant, port: PortId, vnet: &Vnet, pkt: &mut PacketBuf) {
        self.dp
            .write_port_buf(now, self.tx.as_deref_mut(), port, vnet, pkt);
    }
    fn forward_bytes(&mut self, now: Instant, port: PortId, vnet: &[u8], frame: &[u8]) {
        self.dp
            .write_port(now, self.tx.as_deref_mut(), port, vnet, frame);
    }
    fn steer(&mut self, msg: &Msg, port: PortId, vnet: &Vnet, frame: &[u8]) -> bool {
        self.plane
            .as_deref_mut()
            .and_then(|p| p.vnic.as_mut())
            .is_some_and(|v| v.send_frame(msg, port.0, vnet, frame))
    }
    fn hand_off(&mut self, to: usize, port: PortId, vnet: &Vnet, frame: &[u8]) {
        match self.links.as_deref_mut() {
            Some(l) => self.refused |= !l.hand_off(to, port, vnet, frame, self.reoffer),
            None => {
                tracing::error!(target: "spillway::run", shard = to, "a frame of another shard on a node of one thread");
            }
        }
    }
    fn keep(&mut self, port: PortId, vnet: &Vnet, frame: &[u8]) -> bool {
        if self.plane.is_some() || self.reoffer {
            return false;
        }
        self.kept
            .as_deref_mut()
            .is_some_and(|k| k.keep(&mut self.dp.counters, port, vnet, frame))
    }
    fn counters(&mut self) -> &mut RtCounters {
        &mut self.dp.counters
    }
}

/// A frame from VM port slot `i` of `dp`, read into `pkt` (its virtio-net header, if the port
/// has one, right in front of it): through the DPU node and on ([`offer_frame`]), or to the
/// thread of its shard if the node says it is another's (`links`, with several forwarding
/// threads).
fn on_vm_frame(
    sw: &mut Switch,
    dp: &mut DataPath,
    (planes, tx, kept): (
        &mut [Option<PlaneProc>; 2],
        Option<&mut TapTx>,
        &mut KeptFrames,
    ),
    links: Option<&mut Links>,
    now: Instant,
    i: usize,
    pkt: &mut PacketBuf,
) -> Result<(), (PlaneSlot, String)> {
    dp.counters.rx_frames += 1;
    let has_hdr = match dp.ports[i].io {
        PortIo::Tap(_) => dp.vnet_hdr,
        PortIo::Shm(_) | PortIo::VhostUser(_) => true,
    };
    let Some(vnet) = take_vnet(pkt, has_hdr, &mut dp.counters) else {
        return Ok(());
    };
    let port = dp.ports[i].id;
    let mut out = PortsOut {
        dp,
        plane: by_role(planes, sw.dpu().active_slot()).0,
        tx,
        links,
        kept: Some(kept),
        reoffer: false,
        refused: false,
    };
    offer_frame(sw, &mut out, now, port, &vnet, pkt);
    send_outgoing(sw, planes, now)
}

/// The virtio-net header of a frame with nothing offloaded.
pub(super) const PLAIN_VNET: Vnet = [0; VnetHdr::LEN];

/// Per-second rates for `ctl status`, from counter deltas.
#[derive(Debug, Default)]
pub(super) struct Rates {
    pub(super) at: Instant,
    pub(super) base: BTreeMap<String, u64>,
    /// Per-second rates of the DPU process's counters and of the plane's (`plane.*`, `spill.*`),
    /// so `ctl status` shows each plane's rates side by side.
    pub(super) per_sec: BTreeMap<String, f64>,
}

/// The DPU process.
#[derive(Debug)]
pub struct DpuDaemon {
    pub(super) tb: Testbed,
    pub(super) clock: Clock,
    pub(super) sw: Switch,
    /// With several forwarding threads (`fabric.dpu.shards > 1`): this thread's ends of the
    /// hand-off between them, and the others.
    pub(super) links: Option<Links>,
    pub(super) fwd: Option<Forwarders>,
    /// The TAPs' io_uring; declared before `dp`, whose TAPs it holds registered, so it goes
    /// first.
    pub(super) taps: Option<TapUring>,
    pub(super) dp: DataPath,
    /// The plane processes, by plane slot ([`PlaneSlot::index`]): the active one and, with
    /// warm standby or during an upgrade, the other.
    pub(super) planes: [Option<PlaneProc>; 2],
    /// Stopped planes not yet reaped.
    pub(super) retiring: Vec<Retiring>,
    /// Frames a failed plane never took (from its phy ring, or steered to it during the flip
    /// away from it), waiting to be offered again.
    pub(super) reclaimed: KeptFrames,
    /// The binary the next plane runs (`spillway ctl upgrade --binary` changes it).
    pub(super) plane_exe: PathBuf,
    pub(super) listener: UnixListener,
    pub(super) vnic_path: PathBuf,
    pub(super) cgroup: Option<Cgroup>,
    pub(super) ledger: Option<Ledger>,
    pub(super) ctl: Option<CtlServer>,
    pub(super) metrics: Option<MetricsServer>,
    pub(super) publisher: SnapshotPublisher,
    /// The cluster agent (`[cluster]`), when the loop last exchanged with it, and when it
    /// last had this host's record.
    pub(super) cluster: Option<crate::ops::cluster::ClusterAgent>,
    pub(super) last_cluster: Instant,
    pub(super) last_record: Instant,
    /// The remote-plane service of a pool host (`[cluster] pool_listen`).
    pub(super) pool: Option<crate::remote::pool::PoolService>,
    pub(super) events: VecDeque<FabricEvent>,
    pub(super) activations: Vec<Activation>,
    pub(super) last_prepare: Option<Instant>,
    pub(super) last_publish: Instant,
    pub(super) last_manage: Instant,
    pub(super) spin: Spin,
    /// Loop turns so far: which port goes first this turn.
    pub(super) turn: u32,
    pub(super) rates: Rates,
    /// The frame buffer ports outside the ring are read into.
    pub(super) rx: PacketBuf,
    /// The descriptors `sleep` polls, rebuilt in place every time: the loop sleeps between
    /// batches under paced traffic, so collecting them into a new `Vec` allocated per batch.
    pub(super) poll_set: Vec<libc::pollfd>,
    /// This thread's allocations in upkeep and metrics publishing, apart from forwarding's
    /// (see `upkeep`).
    pub(super) allocs: allocs::Upkeep,
    /// Whether the plane delivers into shared-memory VMs itself (vATC) or back via the DPU.
    pub(super) vatc: bool,
}

impl DpuDaemon {
    /// The ctl socket's path.
    pub fn ctl_path(&self) -> &Path {
        &self.tb.ctl_socket
    }

    /// Runs until SIGINT/SIGTERM (or [`signals::request_stop`]), then tears everything down.
    pub fn run(mut self) -> Result<RunReport, RunError> {
        let result = self.run_loop();
        let report = self.teardown();
        result.map(|()| report)
    }

    fn run_loop(&mut self) -> Result<(), RunError> {
        while !signals::stop_requested() {
            let now = self.clock.now();
            let mut busy = self.poll_taps(now)?;
            busy |= self.poll_plane(now);
            busy |= self.poll_links(now);
            // This turn's writes go out at once; the frames that came meanwhile come in, for
            // the next turn.
            self.enter_ring()?;
            self.dp.flush_irqs();
            let due = self.sw.poll_timeout().is_some_and(|t| t <= now);
            if due {
                self.sw.dpu_mut().handle_timeout(now);
            }
            self.after_input(now);
            if !self.reclaimed.is_empty() {
                self.reoffer(now);
            }
            if let Some(l) = self.links.as_mut() {
                l.publish_view(self.sw.dpu().view());
            }
            // The plane's process (accept, waitpid) and ctl every 2 ms, not every turn: two
            // syscalls a turn cost a busy loop about as much as forwarding a frame.
            if now.0.saturating_sub(self.last_manage.0) >= 2_000_000 {
                self.last_manage = now;
                self.upkeep(now);
            }
            if now.0.saturating_sub(self.last_publish.0) >= PUBLISH_NS {
                let mark = self.allocs.begin();
                self.publish(now);
                self.allocs.end(mark);
            }
            if self.spin.sleep_due(busy) {
                self.upkeep(now);
                self.enter_ring()?;
                if !self.taps.as_ref().is_some_and(TapUring::has_frames) {
                    self.sleep();
                }
            }
        }
        Ok(())
    }

    /// The process's upkeep, off the data path: the plane's process, the VM ports' sockets,
    /// `ctl`. What it allocates is counted apart from forwarding (`ctl status`'s
    /// `forwarding_allocs` and `upkeep_allocs`), so the forwarding figure shows what moving
    /// frames costs.
    fn upkeep(&mut self, now: Instant) {
        let mark = self.allocs.begin();
        self.manage_plane(now);
        // The VM ports' sockets, then what changed about them to the plane.
        self.dp.manage_ports(now);
        self.tell_plane_vm_changes();
        self.serve_ctl(now);
        self.allocs.end(mark);
    }

    /// One batch from every port, round robin: each port gets at most [`TAP_BATCH`] frames and
    /// [`PORT_BYTES_PER_TURN`] bytes (and a shared-memory port at most
    /// [`vmport::BAD_DESC_PER_TURN`](crate::dpu::vmport::BAD_DESC_PER_TURN) bad descriptors)
    /// before the next one, and the port that goes first moves on by one every turn, so no port
    /// always waits behind the others.
    fn poll_taps(&mut self, now: Instant) -> Result<bool, RunError> {
        let mut busy = false;
        let n_ports = self.dp.ports.len();
        self.turn = self.turn.wrapping_add(1);
        for k in 0..n_ports {
            let i = (self.turn as usize + k) % n_ports;
            match &mut self.dp.ports[i].io {
                PortIo::Shm(slot) => {
                    if let Some(port) = slot.port.as_mut() {
                        port.begin_turn(now.0);
                    }
                }
                PortIo::VhostUser(slot) => slot.budget.begin_turn(now.0),
                PortIo::Tap(_) => {}
            }
            let mut bytes = 0usize;
            for _ in 0..TAP_BATCH {
                if bytes >= PORT_BYTES_PER_TURN {
                    break;
                }
                let in_ring = self.dp.ports[i].file.is_some();
                // Read in place: the virtio-net header (on a TAP that has one, and always on
                // a shared-memory port) into the headroom, the frame after it.
                let prefix = match &self.dp.ports[i].io {
                    PortIo::Tap(_) if !self.dp.vnet_hdr => 0,
                    _ => VnetHdr::LEN,
                };
                let area = self.rx.receive_area(prefix);
                let n = match &mut self.dp.ports[i].io {
                    // Read by the ring: its frames come below.
                    PortIo::Tap(_) if in_ring => break,
                    PortIo::Tap(tap) => match tap.read(area) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(io_err("reading a TAP")(e)),
                    },
                    PortIo::VhostUser(slot) => {
                        match vdev::recv(&slot.backend.dev, &mut slot.tx_turn, area) {
                            Ok(Some(n)) => {
                                if VnetHdr::parse(area)
                                    .is_ok_and(|h| h.gso_type != VnetHdr::GSO_NONE)
                                {
                                    self.dp.counters.vm_from_guest_gso += 1;
                                }
                                n
                            }
                            Ok(None) => break,
                            Err(ChainError::Bad(_)) => {
                                // Returned to the guest; at most a budget of them per turn, and
                                // a window's worth detaches the port (as for a shared-memory one).
                                self.dp.counters.vm_desc_bad += 1;
                                slot.budget.note_bad_in_turn();
                                slot.budget.note_bad();
                                match slot.budget.turn() {
                                    Turn::Open if slot.budget.misbehaving().is_none() => continue,
                                    Turn::JustSpent => self.dp.counters.vm_desc_turn_budget += 1,
                                    _ => {}
                                }
                                break;
                            }
                            Err(ChainError::Broken) => {
                                self.dp.vhost_broken(i);
                                break;
                            }
                        }
                    }
                    PortIo::Shm(slot) => {
                        let Some(port) = slot.port.as_mut() else {
                            break;
                        };
                        match port.recv(area) {
                            Ok(Some(n)) => n,
                            Ok(None) => break,
                            Err(e) => {
                                tracing::warn!(target: "spillway::run", vm = %slot.vm, error = %e, "VM transmit queue broken; detaching the port");
                                self.dp.detach(i, now, DetachReason::Broken);
                                break;
                            }
                        }
                    }
                };
                busy = true;
                bytes += n;
                if self.rx.set_received(prefix, n).is_err() {
                    self.dp.counters.drop_vnet_hdr += 1;
                    continue;
                }
                let r = on_vm_frame(
                    &mut self.sw,
                    &mut self.dp,
                    (
                        &mut self.planes,
                        self.taps.as_mut().map(|t| t.tx()),
                        &mut self.reclaimed,
                    ),
                    self.links.as_mut(),
                    now,
                    i,
                    &mut self.rx,
                );
                if let Err((slot, e)) = r {
                    self.plane_failed_in(slot, now, &e);
                }
            }
            self.dp.detach_if_misbehaving(i, now);
        }
        // The TAPs in the ring: the frames its last `enter` collected, at most one per receive
        // buffer of the TAP (`2 * TAP_RING_READS`), so no TAP holds the loop.
        if let Some(taps) = self.taps.as_mut() {
            let (sw, dp, planes, links, kept) = (
                &mut self.sw,
                &mut self.dp,
                &mut self.planes,
                &mut self.links,
                &mut self.reclaimed,
            );
            let mut failed = None;
            let n = taps
                .drain_frames(|file, pkt, tx| {
                    let i = dp.tap_slots[file];
                    let out = (&mut *planes, Some(tx), &mut *kept);
                    if let Err(e) = on_vm_frame(sw, dp, out, links.as_mut(), now, i, pkt) {
                        failed = Some(e);
                    }
                })
                .map_err(io_err("re-arming a TAP read"))?;
            busy |= n > 0;
            if let Some((slot, e)) = failed {
                self.plane_failed_in(slot, now, &e);
            }
        }
        Ok(busy)
    }

    /// Submits the ring's queued writes and re-armed reads and collects what completed.
    fn enter_ring(&mut self) -> Result<(), RunError> {
        if let Some(t) = self.taps.as_mut() {
            t.enter().map_err(io_err("io_uring_enter on the TAPs"))?;
        }
        Ok(())
    }

    /// Records from the planes; true if there were any.
    fn poll_plane(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for slot in [PlaneSlot(0), PlaneSlot(1)] {
            busy |= self.poll_plane_in(slot, now);
        }
        busy
    }

    /// Records from the plane in `slot`; true if there were any. The core takes them as from
    /// that slot ([`DpuSwitch::handle_msg_from`]): the active plane's as the owner's, the warm
    /// plane's as its lifecycle replies, a fenced one's as an orphan's. Conntrack changes are
    /// taken only from the active plane: no other plane owns a connection.
    fn poll_plane_in(&mut self, slot: PlaneSlot, now: Instant) -> bool {
        let Some(plane) = self.planes[slot.index()].as_mut() else {
            return false;
        };
        let Some(vnic) = plane.vnic.as_mut() else {
            return false;
        };
        let (sw, dp, taps, links) = (&mut self.sw, &mut self.dp, &mut self.taps, &mut self.links);
        let mut busy = false;
        let r = vnic.recv_frames(RING_BATCH, |rec| {
            dp.counters.from_plane += 1;
            let port = PortId(rec.port);
            let vnet = *rec.vnet;
            // Another shard's connection: the plane sends those on that shard's lane.
            if let Some(l) = links.as_mut()
                && l.shard_of_conn(rec.msg.conn()).is_some()
            {
                l.counters.misrouted += 1;
                return;
            }
            // A frame from the plane is never another shard's (`process_from_plane`).
            let mut out = PortsOut {
                dp,
                plane: None,
                tx: taps.as_mut().map(|t| t.tx()),
                links: None,
                kept: None,
                reoffer: false,
                refused: false,
            };
            let o = sw.process_from_slot(now, slot, port, rec.msg, (gso_size(&vnet), rec.frame));
            forward::act_from_plane(&mut out, now, o, &vnet, rec.frame.len());
        });
        let mut failure = None;
        match r {
            Ok(n) => busy |= n > 0,
            Err(e) => failure = Some(e.to_string()),
        }
        let mut inbox = Vec::new();
        let mut ct_updates = Vec::new();
        let r = vnic.recv_flow(RING_BATCH, |rec| match rec {
            FlowRecord::Msg(m, s) => inbox.push((m, s)),
            FlowRecord::Ct(s) => ct_updates.push(s),
        });
        match r {
            Ok(n) => busy |= n > 0,
            Err(e) => failure = Some(e.to_string()),
        }
        let mut stats = None;
        let mut vm_msgs = Vec::new();
        let r = vnic.recv_control_paced(now.0, |c| match c {
            Control::Msg(m, s) => inbox.push((m, s)),
            Control::Json(CONTROL_STATS, doc) => stats = Some(doc),
            Control::Json(..) => {}
            Control::Vm(msg, _) => vm_msgs.push(msg),
        });
        for msg in vm_msgs {
            // A translation request: the VM's regions and epoch, as the authority has them. The
            // plane sends nothing else of this kind; anything else is ignored, as before.
            if let VatcMsg::Translate { vm, iova, len } = msg {
                dp.counters.atc_requests += 1;
                let answer = VatcMsg::Regions {
                    vm,
                    epoch: dp.authority.epoch(vm),
                    iova,
                    len,
                    regions: dp.authority.regions(vm).copied().collect(),
                };
                if let Err(e) = vnic.send_vm(&answer, &[]) {
                    failure = Some(e.to_string());
                }
            }
        }
        match r {
            Ok(n) => busy |= n > 0,
            Err(e) => failure = Some(e.to_string()),
        }
        if let Some(doc) = stats {
            plane.stats = doc;
        }
        if !inbox.is_empty() && !plane.up {
            // The plane's first record (its start-up heartbeat) says it runs and has mapped
            // the rings.
            plane.up = true;
            sw.dpu_mut().handle_plane_up_in(now, slot);
        }
        for (m, s) in inbox {
            match links
                .as_mut()
                .and_then(|l| Some((l.shard_of_conn(m.conn())?, l)))
            {
                Some((to, l)) => l.send(
                    to,
                    Parcel::Msg {
                        msg: m,
                        snap: s,
                        slot,
                    },
                ),
                None => sw.handle_msg_from(now, slot, m, s),
            }
        }
        // Only an owner's changes are taken (the core's rule), wherever they go.
        if !sw.takes_conntrack_from(slot) {
            dp.counters.plane_ct_fenced += ct_updates.len() as u64;
            ct_updates.clear();
        }
        for snap in ct_updates {
            let conn = sw.conn_of_snapshot(&snap);
            match links
                .as_mut()
                .and_then(|l| Some((l.shard_of_conn(Some(conn))?, l)))
            {
                Some((to, l)) => l.send(to, Parcel::Ct(snap)),
                None => sw.handle_conntrack(now, &snap),
            }
        }
        if let Some(e) = failure {
            self.plane_failed_in(slot, now, &e);
        }
        busy
    }

    /// What the forwarding threads handed this one: frames of shard 0's connections, their
    /// messages for the plane's control socket, the end markers their lanes carried, a lane
    /// that broke. True if there were any.
    fn poll_links(&mut self, now: Instant) -> bool {
        if self.links.is_none() {
            return false;
        }
        let mut busy = false;
        for _ in 0..RING_BATCH {
            let Some(p) = self.links.as_mut().and_then(Links::recv) else {
                break;
            };
            busy = true;
            let a = self.sw.dpu().active_slot().index();
            match p {
                Parcel::Frame {
                    from,
                    port,
                    vnet,
                    mut pkt,
                    reoffer,
                } => {
                    pkt.set_gso_size(gso_size(&vnet));
                    // Handed here as shard 0's: the node serves it, and keeps it as a frame
                    // read here if it is steered to a plane that is gone.
                    let mut out = PortsOut {
                        dp: &mut self.dp,
                        plane: self.planes[a].as_mut(),
                        tx: self.taps.as_mut().map(|t| t.tx()),
                        links: None,
                        kept: Some(&mut self.reclaimed),
                        reoffer,
                        refused: false,
                    };
                    offer_frame(&mut self.sw, &mut out, now, port, &vnet, &mut pkt);
                    self.recycle(from, pkt);
                }
                Parcel::Out { o, slot } => {
                    let vnic = self.planes[slot.index()]
                        .as_mut()
                        .and_then(|p| p.vnic.as_mut());
                    if let Some(v) = vnic
                        && let Err(e) = v.send_outgoing(&o)
                    {
                        let e = e.to_string();
                        self.plane_failed_in(slot, now, &e);
                        return true;
                    }
                }
                // What a forwarding thread's lane carried for the control part (an end
                // marker, a digest), taken as from the lane's slot.
                Parcel::Msg { msg, snap, slot } => self.sw.handle_msg_from(now, slot, msg, snap),
                Parcel::LaneFailed { plane, why } => {
                    if let Some(slot) = self.slot_of_plane(plane) {
                        self.plane_failed_in(slot, now, &why);
                        return true;
                    }
                }
                Parcel::LaneBack { lane, plane } => self.lane_back(*lane, plane),
                // A forwarding thread's frame for a port only this thread writes.
                Parcel::ToPort {
                    from,
                    port,
                    vnet,
                    mut pkt,
                } => {
                    let tx = self.taps.as_mut().map(|t| t.tx());
                    self.dp.write_port_buf(now, tx, port, &vnet, &mut pkt);
                    self.recycle(from, pkt);
                }
                Parcel::Keep {
                    from,
                    port,
                    vnet,
                    pkt,
                } => {
                    self.reclaimed
                        .keep(&mut self.dp.counters, port, &vnet, pkt.data());
                    self.recycle(from, pkt);
                }
                p @ (Parcel::Ct(_)
                | Parcel::Flows(..)
                | Parcel::Policy(_)
                | Parcel::Lane { .. }
                | Parcel::LaneClosed { .. }) => {
                    tracing::error!(target: "spillway::run", parcel = ?p, "a parcel for a forwarding thread reached thread 0");
                }
            }
        }
        for p in self.planes.iter_mut().flatten() {
            if let Some(v) = p.vnic.as_mut() {
                v.kick();
            }
        }
        busy
    }

    /// Gives a frame buffer back to the forwarding thread it came from.
    fn recycle(&self, from: usize, pkt: PacketBuf) {
        if let Some(l) = self.links.as_ref() {
            l.recycle(from, pkt);
        }
    }

    /// Drains the core's outputs after this turn's inputs.
    pub(super) fn after_input(&mut self, now: Instant) {
        // A plane that fails here may make the core fail over, which queues more: until
        // quiet (each failure takes a process out of its slot, so this ends).
        while let Err((slot, e)) = send_outgoing(&mut self.sw, &mut self.planes, now) {
            self.plane_failed_in(slot, now, &e);
        }
        while let Some(cmd) = self.sw.poll_command() {
            match cmd {
                DpuCommand::StartPlane {
                    slot,
                    workers,
                    remote,
                } => self.start_plane(now, slot, workers, remote),
                DpuCommand::StopPlane { slot, failed } => self.stop_plane(slot, failed),
            }
        }
        while let Some(ev) = self.sw.poll_event() {
            self.on_event(&ev);
            if self.events.len() == EVENTS_KEPT {
                self.events.pop_front();
            }
            self.events.push_back(ev);
        }
    }

    fn on_event(&mut self, ev: &FabricEvent) {
        tracing::info!(target: "spillway::fabric", event = ev.what.name(), at_ms = ev.at.0 as f64 / 1e6, reason = %ev.reason);
        let ms = |a: Instant, b: Instant| (a.0.saturating_sub(b.0)) as f64 / 1e6;
        match ev.what {
            EventKind::Preparing => self.last_prepare = Some(ev.at),
            EventKind::Active => {
                // Cold when the trigger came no later than the plane's start (the prepare was
                // part of this activation); warm when the plane was already up in shadow.
                let cold = match (ev.since, self.last_prepare) {
                    (Some(t), Some(p)) => t <= p,
                    _ => false,
                };
                self.activations.push(Activation {
                    cold,
                    rules_live_ms: ev.since.map(|t| ms(ev.at, t)),
                    first_packet_ms: None,
                });
            }
            EventKind::Absorbing => {
                if let (Some(since), Some(a)) = (ev.since, self.activations.last_mut()) {
                    a.first_packet_ms = Some(ms(ev.at, since));
                }
            }
            _ => {}
        }
    }

    fn sleep(&mut self) {
        let now = self.clock.now();
        let next = self
            .sw
            .poll_timeout()
            .map_or(10_000_000, |t| t.0.saturating_sub(now.0));
        // Wake at least every 10 ms for the plane's process, ctl requests and metrics.
        let timeout_ms = (next / 1_000_000).clamp(0, 10) as i32;
        let mut armed = true;
        for v in self
            .planes
            .iter_mut()
            .flatten()
            .filter_map(|p| p.vnic.as_mut())
        {
            armed &= v.prepare_sleep();
        }
        if let Some(l) = self.links.as_mut() {
            armed &= l.prepare_sleep();
        }
        for p in &mut self.dp.ports {
            match &mut p.io {
                PortIo::Shm(slot) => {
                    if let Some(port) = slot.port.as_mut() {
                        armed &= port.prepare_sleep();
                    }
                }
                PortIo::VhostUser(slot) => {
                    // The kick fds are current: the upkeep just before looked at the device.
                    armed &= vdev::prepare_sleep(slot.dev());
                }
                PortIo::Tap(_) => {}
            }
        }
        if !armed {
            self.dp.woke_ports();
            return;
        }
        let readable = |fd: BorrowedFd<'_>| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let set = &mut self.poll_set;
        set.clear();
        for p in &self.dp.ports {
            let fd = match &p.io {
                PortIo::Tap(tap) => tap.as_fd(0),
                PortIo::Shm(slot) => slot.port.as_ref().map(|p| p.kick_fd()),
                PortIo::VhostUser(slot) => {
                    // A change of the device (a new kick fd, a ring started) wakes the loop too.
                    set.push(readable(slot.dev().changed.as_fd()));
                    set.extend(slot.kicks.iter().flatten().map(|k| readable(k.as_fd())));
                    None
                }
            };
            set.extend(fd.map(readable));
        }
        for v in self.planes.iter().flatten().filter_map(|p| p.vnic.as_ref()) {
            set.extend(v.poll_fds().map(readable));
        }
        set.push(readable(self.listener.as_fd()));
        if let Some(l) = &self.links {
            set.push(readable(l.bell_fd()));
        }
        // SAFETY: `set` holds `set.len()` initialised `pollfd`s; every fd in it belongs to a
        // port, the plane's vNIC or the ctl listener, all owned by `self` and none closed
        // during the call; `poll` only writes the entries' `revents`. The result is not needed:
        // every source is polled again after waking, whatever woke it.
        let _ = unsafe { libc::poll(set.as_mut_ptr(), set.len() as libc::nfds_t, timeout_ms) };
        for v in self
            .planes
            .iter_mut()
            .flatten()
            .filter_map(|p| p.vnic.as_mut())
        {
            v.woke();
            v.polled(set);
        }
        if let Some(l) = &self.links {
            l.woke();
        }
        self.dp.woke_ports();
    }

    fn teardown(&mut self) -> RunReport {
        self.stop_planes();
        // The planes served for other hosts, and what was made for them.
        self.pool.take();
        self.ctl.take();
        self.metrics.take();
        // The forwarding threads last publish their counters as they stop.
        if let Some(f) = self.fwd.as_mut() {
            f.stop();
        }
        let counters = self.rt_counters();
        // Close the TAPs (the ring first, which holds them) before removing the namespaces
        // they live in.
        self.taps.take();
        self.dp.ports.clear();
        self.cgroup.take();
        let cleaned = match self.ledger.take() {
            Some(mut l) => {
                let r = l.cleanup();
                for (entry, why) in &r.failed {
                    tracing::error!(target: "spillway::run", ?entry, reason = %why, "cleanup failed");
                }
                r.removed.len()
            }
            None => 0,
        };
        tracing::info!(target: "spillway::run", cleaned, "testbed down");
        RunReport {
            counters,
            activations: self.activations.clone(),
            cleaned,
        }
    }
}
