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

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::json;
use spillway_fabric::dpu::Role;
use spillway_fabric::dpu::{Command as DpuCommand, EventKind, FabricEvent, Hold};
use spillway_fabric::frame::{CONNS_MAX, DpuSwitch, Outcome};
use spillway_fabric::params::PlacementKind;
use spillway_vswitch::pipeline::PipelineConfig;
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PortId};

use crate::dpu::vmport::{self, ShmPort};
use crate::host::allocs;
use crate::host::cgroup::{Cgroup, CgroupSpec};
use crate::host::clock::Clock;
use crate::host::ledger::{Ledger, LedgerEntry};
use crate::host::signals;
use crate::host::tap::Tap;
use crate::host::tap_uring::{TapTx, TapUring};
use crate::host::vnet::VnetHdr;
use crate::ops::ctl::{
    CtlCall, CtlRequest, CtlResponse, CtlServer, FLOWS_LIMIT_DEFAULT, FLOWS_LIMIT_MAX, FlowOwner,
};
use crate::ops::metrics::{MetricsServer, Sample, Snapshot, SnapshotPublisher};
use crate::shm::codec::VatcMsg;
use crate::shm::vnic::{CONTROL_COMMAND, CONTROL_STATS, Control, FlowRecord, VnicSet};
use crate::testbed::{InitialHold, TapIo, Testbed, VmBackend, VmEndpoint};
use spillway_fabric::atc::{RegionTable, VmId};

/// Frames read from one port (TAP or shared-memory) per loop turn before the next port gets
/// its turn.
const TAP_BATCH: usize = 64;
/// Bytes read from one port per loop turn: after the frame that crosses it the next port gets
/// its turn, so a VM sending 64 KiB GSO frames holds the loop for 4 of them, not 64.
const PORT_BYTES_PER_TURN: usize = 256 << 10;
/// How long a port detached for what its VM did (a broken queue, [`vmport::Misbehaviour`])
/// refuses a new attach, ns: a VM that reconnects at once to misbehave again costs the loop an attach a second.
const QUARANTINE_NS: u64 = 1_000_000_000;
/// Records taken from a ring per loop turn.
const RING_BATCH: usize = 256;
/// Frame buffer: a 64 KiB GSO frame plus its virtio-net header and tags.
const FRAME_MAX: usize = 12 + 18 + 65_535;
/// How long an endpoint that connected may take to send its attach message, ns.
const ATTACH_WAIT_NS: u64 = 2_000_000_000;
/// Turns without work before the loop sleeps in `poll`.
const SPIN_TURNS: u32 = 64;
/// Lifecycle events kept for `ctl status`.
const EVENTS_KEPT: usize = 64;

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
        /// Shared-memory VM ports attached (endpoint connected).
        vm_attached => "rt.vm.attached",
        /// Shared-memory VM ports detached (endpoint gone or queue broken).
        vm_detached => "rt.vm.detached",
        /// Frames for a shared-memory VM that had no receive buffer posted.
        vm_rx_no_buffer => "rt.vm.rx.no_buffer",
        /// Descriptors of a shared-memory VM refused (bad address, flags, size).
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

/// A VM port: its tenant and how its frames come and go.
#[derive(Debug)]
struct Port {
    id: PortId,
    io: PortIo,
    /// A TAP port's file in the io_uring (`testbed.tap_io = "io_uring"`), if the ring runs.
    file: Option<usize>,
}

#[derive(Debug)]
enum PortIo {
    /// A TAP this process holds.
    Tap(Tap),
    /// A shared-memory port, attached while its endpoint is connected.
    Shm(Box<ShmSlot>),
}

/// A shared-memory VM port's place: its socket, the attached port, the bridge endpoint this
/// process started (if it did).
#[derive(Debug)]
struct ShmSlot {
    vm: String,
    listener: UnixListener,
    port: Option<ShmPort>,
    /// A connection whose attach message has not arrived yet, and when it was accepted.
    pending: Option<(UnixStream, Instant)>,
    bridge: Option<Child>,
    /// The uid allowed to attach (`[[vm]] uid`); the bridge this process started is allowed too.
    uid: u32,
    /// Detached for misbehaviour: no new attach before this time.
    quarantine_until: Option<Instant>,
}

/// Why a shared-memory port was detached (each counted as `rt.vm.detached.<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DetachReason {
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

/// Connections taken from the vNIC socket per loop turn.
const VNIC_ACCEPTS_PER_TURN: usize = 16;

/// Whether the `n`th refusal of a kind is logged: the 1st, 2nd, 4th, 8th, ... A peer that
/// connects in a loop costs a counter increment, not a log line per attempt; the counter
/// (`rt.vnic.rejected`, `rt.vm.rejected`) has the exact number.
fn worth_logging(n: u64) -> bool {
    n.is_power_of_two()
}

/// A change of a shared-memory port that the spill plane must hear of.
#[derive(Clone, Copy, Debug)]
enum VmChange {
    Attached(PortId),
    Detached(PortId),
}

/// The vATC's name for a port's VM.
fn vm_id(port: PortId) -> VmId {
    VmId(port.0)
}

/// The plane's process as the DPU process sees it.
#[derive(Debug)]
struct PlaneProc {
    child: Child,
    /// The handshake secret handed to `child` on its stdin.
    secret: [u8; crate::shm::vnic::SECRET_LEN],
    vnic: Option<VnicSet>,
    up: bool,
    workers: u32,
    stats: serde_json::Value,
}

/// The ports' side of the data path: the TAPs and shared-memory queues frames come and go by,
/// and what the driver counts of moving them. (The DPU itself, model and vSwitch, is the
/// core's [`DpuSwitch`], beside this.)
#[derive(Debug)]
struct DataPath {
    ports: Vec<Port>,
    /// The port slot of each file in the TAP ring.
    tap_slots: Vec<usize>,
    port_index: BTreeMap<PortId, usize>,
    vnet_hdr: bool,
    counters: RtCounters,
    /// The vATC authority: the registered memory of every attached shared-memory VM.
    authority: RegionTable,
    /// Port changes not yet told to the plane.
    vm_changes: Vec<VmChange>,
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
fn io_err<W: Into<String>>(what: W) -> impl FnOnce(io::Error) -> RunError {
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

impl DataPath {
    fn port_slot(&self, id: PortId) -> Option<usize> {
        self.port_index.get(&id).copied()
    }

    /// Sends `frame` (with virtio-net header `vnet`) out of `port`: through the io_uring `tx`
    /// when the port is a TAP in it, else by a system call or into the VM's queue.
    fn write_port(
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
                let hdr = match VnetHdr::parse(vnet) {
                    Ok(h) => h.to_bytes(),
                    Err(_) => VnetHdr::NONE.to_bytes(),
                };
                let hdr: &[u8] = if self.vnet_hdr { &hdr } else { &[] };
                tx.write(file, [hdr, frame])
            }
            _ => self.write_io(now, i, vnet, frame),
        };
        if r {
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

    /// Detaches shared-memory port slot `i` for `why` at `now`: its memory leaves the authority
    /// (which bumps the VM's epoch) and the plane is told to invalidate. A port detached for
    /// what its VM did (a broken queue, a budget) takes no new attach for [`QUARANTINE_NS`].
    fn detach(&mut self, i: usize, now: Instant, why: DetachReason) {
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
    fn detach_if_misbehaving(&mut self, i: usize, now: Instant) {
        if let PortIo::Shm(slot) = &self.ports[i].io
            && let Some(m) = slot.port.as_ref().and_then(ShmPort::misbehaving)
        {
            self.detach(i, now, DetachReason::Misbehaved(m));
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

    /// Interrupts every shared-memory VM that got frames (or buffers back) this turn.
    fn flush_irqs(&mut self) {
        for p in &mut self.ports {
            if let PortIo::Shm(slot) = &mut p.io
                && let Some(port) = slot.port.as_mut()
            {
                port.flush_irq();
            }
        }
    }
}

fn sample_f64(v: &crate::ops::metrics::SampleValue) -> f64 {
    match *v {
        crate::ops::metrics::SampleValue::U64(x) => x as f64,
        crate::ops::metrics::SampleValue::I64(x) => x as f64,
        crate::ops::metrics::SampleValue::F64(x) => x,
    }
}

/// Sends the node's messages to the plane (its snapshots attached), then rings the plane's
/// doorbell. With no plane connected they are dropped: the model's fail-open has them covered.
fn send_outgoing(
    sw: &mut DpuSwitch,
    plane: Option<&mut PlaneProc>,
    now: Instant,
) -> Result<(), String> {
    let mut vnic = plane.and_then(|p| p.vnic.as_mut());
    while let Some(o) = sw.poll_transmit(now) {
        if let Some(v) = vnic.as_deref_mut() {
            v.send_outgoing(&o).map_err(|e| e.to_string())?;
        }
    }
    if let Some(v) = vnic {
        v.kick();
    }
    Ok(())
}

/// Creates listening socket `path` (mode 0600, owned by `owner` if given, whatever the umask)
/// and then records it: a file only goes into the ledger once this process created it, so a
/// failed start never removes somebody else's. A stale socket of a crashed run is replaced; any
/// other file at `path` is an error and left alone.
fn bind_and_record(
    ledger: &mut Ledger,
    path: &Path,
    owner: Option<u32>,
) -> Result<UnixListener, RunError> {
    crate::host::unixsock::remove_stale(path)
        .map_err(io_err(format!("socket {}", path.display())))?;
    let listener = crate::host::unixsock::bind(path, 0o600, owner)
        .map_err(io_err(format!("binding {}", path.display())))?;
    if let Err(e) = ledger.record(LedgerEntry::File(path.to_owned())) {
        drop(listener);
        let _ = std::fs::remove_file(path);
        return Err(RunError::Setup(format!("ledger: {e}")));
    }
    Ok(listener)
}

/// Starts `spillway vm-endpoint --mode bridge` for VM `name`, handing it `tap` as an inherited
/// fd (the only fd it inherits: every other one is close-on-exec).
fn spawn_bridge(
    exe: &Path,
    tb: &Testbed,
    name: &str,
    tap: Tap,
    ledger: &mut Ledger,
) -> Result<Child, RunError> {
    let fd = tap
        .as_fd(0)
        .ok_or_else(|| RunError::Setup(format!("vm {name}: TAP has no queue")))?;
    // SAFETY: `dup` on an fd we own (borrowed from `tap`, alive here) returns a new fd, not
    // close-on-exec, which only the child spawned next inherits; it is closed below.
    let raw = unsafe { libc::dup(fd.as_raw_fd()) };
    if raw < 0 {
        return Err(io_err(format!("vm {name}: dup of the TAP"))(
            io::Error::last_os_error(),
        ));
    }
    let mut cmd = Command::new(exe);
    cmd.arg("vm-endpoint")
        .arg("--config")
        .arg(&tb.file)
        .arg("--vm")
        .arg(name)
        .arg("--mode")
        .arg("bridge")
        .arg("--tap-fd")
        .arg(raw.to_string())
        .stdin(Stdio::null());
    let r = ledger
        .spawn(&mut cmd)
        .map_err(|e| RunError::Setup(format!("vm {name}: starting its endpoint: {e}")));
    // SAFETY: `raw` is the fd `dup` returned above, owned by nobody else in this process.
    unsafe {
        libc::close(raw);
    }
    drop(tap);
    r
}

/// A frame from VM port slot `i` of `dp`, through the DPU node and on: out of a port, or
/// to the plane on the phy ring with the virtio-net header it came with.
fn on_vm_frame(
    sw: &mut DpuSwitch,
    dp: &mut DataPath,
    (plane, tx): (Option<&mut PlaneProc>, Option<&mut TapTx>),
    now: Instant,
    i: usize,
    buf: &[u8],
) -> Result<(), String> {
    dp.counters.rx_frames += 1;
    let vnet_hdr = match dp.ports[i].io {
        PortIo::Tap(_) => dp.vnet_hdr,
        PortIo::Shm(_) => true,
    };
    let (vnet, frame) = if vnet_hdr {
        if buf.len() < VnetHdr::LEN {
            dp.counters.drop_vnet_hdr += 1;
            return Ok(());
        }
        buf.split_at(VnetHdr::LEN)
    } else {
        (&PLAIN_VNET[..], buf)
    };
    let vnet: &[u8; VnetHdr::LEN] = vnet.try_into().expect("split at the header's length");
    let gso = VnetHdr::parse(vnet).map_or(0, |h| h.gso_segment());
    let port = dp.ports[i].id;
    let mut plane = plane;
    match sw.process(now, port, gso, frame) {
        Outcome::Forward {
            port: out,
            bytes,
            generated,
        } => {
            let vnet = if generated { &PLAIN_VNET } else { vnet };
            dp.write_port(now, tx, out, vnet, bytes);
        }
        Outcome::Steer { msg } => {
            let sent = plane
                .as_deref_mut()
                .and_then(|p| p.vnic.as_mut())
                .is_some_and(|v| v.send_frame(&msg, port.0, vnet, frame));
            if sent {
                dp.counters.steered += 1;
            } else {
                dp.counters.drop_plane_gone += 1;
            }
        }
        Outcome::Drop(why) => {
            tracing::debug!(target: "spillway::drop", ?why, len = frame.len(), "the DPU dropped a frame");
        }
        other => {
            tracing::error!(target: "spillway::run", outcome = ?other, "a DPU outcome only the plane has");
        }
    }
    send_outgoing(sw, plane, now)
}

/// The virtio-net header of a frame with nothing offloaded.
const PLAIN_VNET: [u8; VnetHdr::LEN] = [0; VnetHdr::LEN];

/// Reads kept armed on each TAP in the ring: at most this many frames of one TAP per loop turn.
/// 32 measured as well as 64 (docs/adr/0005-tap-io.md).
const TAP_RING_READS: usize = 32;
/// Transmit buffers of the ring: writes a loop turn may queue before its `enter`.
const TAP_RING_TX: usize = 256;

/// Puts the TAP ports of `ports` into one io_uring and marks each with its file; returns the
/// ring and the port slot of each file. Where the kernel refuses the ring (an old kernel, a
/// sandbox without io_uring) the TAPs fall back to system calls, with a warning.
fn tap_ring(ports: &mut [Port]) -> (Option<TapUring>, Vec<usize>) {
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
            PortIo::Shm(_) => None,
        })
        .collect();
    match TapUring::new(&fds, TAP_RING_READS, TAP_RING_TX, FRAME_MAX) {
        Ok(ring) => {
            for (file, &i) in slots.iter().enumerate() {
                ports[i].file = Some(file);
            }
            tracing::info!(target: "spillway::run", taps = slots.len(), "TAP I/O on io_uring");
            (Some(ring), slots)
        }
        Err(e) => {
            tracing::warn!(target: "spillway::run", error = %e, "io_uring refused; TAP I/O by system calls");
            (None, Vec::new())
        }
    }
}

/// The DPU process.
#[derive(Debug)]
pub struct DpuDaemon {
    tb: Testbed,
    clock: Clock,
    sw: DpuSwitch,
    /// The TAPs' io_uring; declared before `dp`, whose TAPs it holds registered, so it goes
    /// first.
    taps: Option<TapUring>,
    dp: DataPath,
    plane: Option<PlaneProc>,
    plane_exe: PathBuf,
    listener: UnixListener,
    vnic_path: PathBuf,
    cgroup: Option<Cgroup>,
    ledger: Option<Ledger>,
    ctl: Option<CtlServer>,
    metrics: Option<MetricsServer>,
    publisher: SnapshotPublisher,
    events: VecDeque<FabricEvent>,
    activations: Vec<Activation>,
    last_prepare: Option<Instant>,
    last_publish: Instant,
    last_manage: Instant,
    idle_turns: u32,
    /// Loop turns so far: which port goes first this turn.
    turn: u32,
    rates: Rates,
    rx: Vec<u8>,
    /// The descriptors `sleep` polls, rebuilt in place every time: the loop sleeps between
    /// batches under paced traffic, so collecting them into a new `Vec` allocated per batch.
    poll_set: Vec<libc::pollfd>,
    /// Allocations this thread made in upkeep and metrics publishing (see `upkeep`).
    upkeep_allocs: u64,
    /// This thread's allocation count when the running upkeep started: `ctl status`, answered
    /// inside it, reports forwarding's allocations up to there, not its own.
    upkeep_mark: u64,
    /// Whether the plane delivers into shared-memory VMs itself (vATC) or back via the DPU.
    vatc: bool,
}

/// Per-second rates for `ctl status`, from counter deltas.
#[derive(Debug, Default)]
struct Rates {
    at: Instant,
    base: BTreeMap<String, u64>,
    /// Per-second rates of the DPU process's counters and of the plane's (`plane.*`, `spill.*`),
    /// so `ctl status` shows each plane's rates side by side.
    per_sec: BTreeMap<String, f64>,
}

impl DpuDaemon {
    /// Brings the testbed up: recovers a crashed predecessor's leftovers, creates the
    /// namespaces and TAPs, the plane's cgroup and sockets, the ctl socket and the metrics
    /// endpoint.
    pub fn start(opts: RunOptions) -> Result<DpuDaemon, RunError> {
        let tb = opts.testbed;
        crate::host::ledger::secure_state_dir(&tb.state_dir)
            .map_err(|e| RunError::Setup(format!("state directory: {e}")))?;
        // What a crashed predecessor of this testbed could have created, and nothing else.
        let mut scope = crate::host::ledger::LedgerScope::new(&tb.state_dir, &tb.name)
            .allow_exe(&opts.plane_exe);
        for vm in &tb.vms {
            scope = scope.allow_netns(&vm.netns).allow_link(&vm.tap);
        }
        match Ledger::recover_in(&tb.state_dir, &tb.name, &scope) {
            Ok(Some(r)) => {
                tracing::warn!(target: "spillway::run", removed = r.removed.len(), failed = r.failed.len(), "removed leftovers of a previous run that did not clean up");
            }
            Ok(None) => {}
            Err(e) => return Err(RunError::Setup(format!("recovering leftovers: {e}"))),
        }
        let mut ledger = Ledger::open(&tb.state_dir, &tb.name)
            .map_err(|e| RunError::Setup(format!("opening the ledger: {e}")))?;
        let ports = match crate::dpu::bringup::bring_up(&tb, &mut ledger) {
            Ok(p) => p,
            Err(e) => {
                ledger.cleanup();
                return Err(RunError::Setup(e));
            }
        };
        let build = |ledger: &mut Ledger| -> Result<DpuDaemon, RunError> {
            let mut out: Vec<Port> = Vec::new();
            let mut bridges = Vec::new();
            for (spec, tap) in ports {
                let io = match (spec.backend, tap) {
                    (VmBackend::Tap, Some(tap)) => PortIo::Tap(tap),
                    (VmBackend::Shm(how), tap) => {
                        let path = vmport::port_socket(&tb, &spec.name);
                        // Owned by the VM's uid, mode 0600: only it (and root) can connect.
                        let owner = (spec.uid != 0).then_some(spec.uid);
                        let listener = bind_and_record(ledger, &path, owner)?;
                        listener
                            .set_nonblocking(true)
                            .map_err(io_err("VM port listener"))?;
                        if how == VmEndpoint::Bridge {
                            let tap = tap.expect("bring_up makes a TAP for a bridged port");
                            bridges.push((out.len(), spec.name.clone(), tap));
                        }
                        PortIo::Shm(Box::new(ShmSlot {
                            vm: spec.name.clone(),
                            listener,
                            port: None,
                            pending: None,
                            bridge: None,
                            uid: spec.uid,
                            quarantine_until: None,
                        }))
                    }
                    (VmBackend::Tap, None) => unreachable!("bring_up makes a TAP for a TAP port"),
                };
                out.push(Port {
                    id: spec.port,
                    io,
                    file: None,
                });
            }
            let mut ports = out;
            // The bridge endpoints: each gets its TAP (this process keeps no copy) and attaches
            // over the socket bound above.
            for (i, name, tap) in bridges {
                let child = spawn_bridge(&opts.plane_exe, &tb, &name, tap, ledger)?;
                if let PortIo::Shm(slot) = &mut ports[i].io {
                    slot.bridge = Some(child);
                }
            }
            let port_index = ports.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
            let (taps, tap_slots) = match tb.tap_io {
                TapIo::Uring => tap_ring(&mut ports),
                TapIo::Syscalls => (None, Vec::new()),
            };
            let mut sw = DpuSwitch::new(
                &tb.fabric,
                tb.policy.clone(),
                PipelineConfig::default(),
                CONNS_MAX,
            )
            .map_err(|e| RunError::Setup(format!("pipeline: {e}")))?;
            let cgroup = {
                let spec = CgroupSpec {
                    cpus: tb.spill_cpus.clone(),
                    mems: "0".into(),
                    memory_max: tb.spill_memory_max,
                };
                let name = format!("{}-plane", tb.name);
                Some(
                    ledger
                        .create_cgroup(&name, &spec)
                        .map_err(|e| RunError::Setup(format!("spill-plane cgroup: {e}")))?,
                )
            };
            let vnic_path = tb.state_dir.join(format!("{}-vnic.sock", tb.name));
            let listener = bind_and_record(ledger, &vnic_path, None)?;
            listener
                .set_nonblocking(true)
                .map_err(io_err("vnic listener"))?;
            // The ctl socket goes into the ledger only once it is ours (bound), and only if it
            // lies in the state directory, the one place recovery may remove files; one
            // elsewhere is removed by our own shutdown, or found stale and replaced by the next
            // start. Its `.lock` is never removed (see `CtlServer`).
            let ctl = CtlServer::bind(&tb.ctl_socket)
                .map_err(|e| RunError::Setup(format!("ctl socket: {e}")))?;
            let in_state_dir = tb
                .ctl_socket
                .parent()
                .and_then(|p| std::fs::canonicalize(p).ok())
                .zip(std::fs::canonicalize(&tb.state_dir).ok())
                .is_some_and(|(a, b)| a == b);
            if in_state_dir {
                ledger
                    .record(LedgerEntry::File(tb.ctl_socket.clone()))
                    .map_err(|e| RunError::Setup(format!("ledger: {e}")))?;
            }
            let snapshot = Snapshot::new("dpu");
            let publisher = snapshot.publisher();
            let metrics = match tb.metrics_addr {
                None => None,
                Some(a) => Some(
                    MetricsServer::bind(a, snapshot)
                        .map_err(|e| RunError::Setup(format!("metrics endpoint {a}: {e}")))?,
                ),
            };
            let clock = Clock::start();
            let now = clock.now();
            match tb.hold {
                InitialHold::Auto => {}
                InitialHold::Active => sw.dpu_mut().handle_hold(now, Hold::Active),
                InitialHold::Released => sw.dpu_mut().handle_hold(now, Hold::Released),
            }
            Ok(DpuDaemon {
                sw,
                taps,
                dp: DataPath {
                    ports,
                    port_index,
                    tap_slots,
                    vnet_hdr: tb.vnet_hdr,
                    counters: RtCounters::default(),
                    authority: RegionTable::new(),
                    vm_changes: Vec::new(),
                },
                clock,
                plane: None,
                plane_exe: opts.plane_exe.clone(),
                listener,
                vnic_path,
                cgroup,
                ledger: None,
                ctl: Some(ctl),
                metrics,
                publisher,
                events: VecDeque::new(),
                activations: Vec::new(),
                last_prepare: None,
                last_publish: Instant::ZERO,
                last_manage: Instant::ZERO,
                idle_turns: 0,
                turn: 0,
                rates: Rates::default(),
                rx: vec![0u8; FRAME_MAX],
                poll_set: Vec::new(),
                upkeep_allocs: 0,
                upkeep_mark: 0,
                vatc: tb.fabric.host.vatc,
                tb: tb.clone(),
            })
        };
        match build(&mut ledger) {
            Ok(mut d) => {
                d.ledger = Some(ledger);
                if let Some(f) = &opts.ready_file {
                    std::fs::write(f, format!("{}\n", std::process::id()))
                        .map_err(io_err(format!("writing {}", f.display())))?;
                }
                tracing::info!(target: "spillway::run", testbed = %d.tb.name, vms = d.tb.vms.len(), ctl = %d.tb.ctl_socket.display(), "testbed up");
                Ok(d)
            }
            Err(e) => {
                ledger.cleanup();
                Err(e)
            }
        }
    }

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
            // This turn's writes go out at once; the frames that came meanwhile come in, for
            // the next turn.
            self.enter_ring()?;
            self.dp.flush_irqs();
            let due = self.sw.poll_timeout().is_some_and(|t| t <= now);
            if due {
                self.sw.dpu_mut().handle_timeout(now);
            }
            self.after_input(now);
            // The plane's process (accept, waitpid) and ctl every 2 ms, not every turn: two
            // syscalls a turn cost a busy loop about as much as forwarding a frame.
            if now.0.saturating_sub(self.last_manage.0) >= 2_000_000 {
                self.last_manage = now;
                self.upkeep(now);
            }
            if now.0.saturating_sub(self.last_publish.0) >= 100_000_000 {
                let mark = allocs::this_thread();
                self.publish(now);
                self.upkeep_allocs += allocs::this_thread() - mark;
            }
            if busy {
                self.idle_turns = 0;
            } else {
                // Spin a few turns before sleeping: a sleep and a wake-up cost more than the
                // frames of a steady stream that arrive meanwhile (context switches dominated a
                // profile of 64-byte UDP), and `poll` wakes us only after the queue has filled.
                self.idle_turns += 1;
                if self.idle_turns > SPIN_TURNS {
                    self.idle_turns = 0;
                    self.upkeep(now);
                    self.enter_ring()?;
                    if !self.taps.as_ref().is_some_and(TapUring::has_frames) {
                        self.sleep();
                    }
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
        let mark = allocs::this_thread();
        self.upkeep_mark = mark;
        self.manage_plane(now);
        self.manage_ports(now);
        self.serve_ctl(now);
        self.upkeep_allocs += allocs::this_thread() - mark;
    }

    /// One batch from every port, round robin: each port gets at most [`TAP_BATCH`] frames and
    /// [`PORT_BYTES_PER_TURN`] bytes (and a shared-memory port at most
    /// [`vmport::BAD_DESC_PER_TURN`] bad descriptors) before the next one, and the port that
    /// goes first moves on by one every turn, so no port always waits behind the others.
    fn poll_taps(&mut self, now: Instant) -> Result<bool, RunError> {
        let mut busy = false;
        let n_ports = self.dp.ports.len();
        self.turn = self.turn.wrapping_add(1);
        for k in 0..n_ports {
            let i = (self.turn as usize + k) % n_ports;
            if let PortIo::Shm(slot) = &mut self.dp.ports[i].io
                && let Some(port) = slot.port.as_mut()
            {
                port.begin_turn(now.0);
            }
            let mut bytes = 0usize;
            for _ in 0..TAP_BATCH {
                if bytes >= PORT_BYTES_PER_TURN {
                    break;
                }
                let in_ring = self.dp.ports[i].file.is_some();
                let n = match &mut self.dp.ports[i].io {
                    // Read by the ring: its frames come below.
                    PortIo::Tap(_) if in_ring => break,
                    PortIo::Tap(tap) => match tap.read(&mut self.rx) {
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(io_err("reading a TAP")(e)),
                    },
                    PortIo::Shm(slot) => {
                        let Some(port) = slot.port.as_mut() else {
                            break;
                        };
                        match port.recv(&mut self.rx) {
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
                let buf = std::mem::take(&mut self.rx);
                let r = on_vm_frame(
                    &mut self.sw,
                    &mut self.dp,
                    (self.plane.as_mut(), self.taps.as_mut().map(|t| t.tx())),
                    now,
                    i,
                    &buf[..n],
                );
                self.rx = buf;
                if let Err(e) = r {
                    self.plane_failed(now, &e);
                }
            }
            self.dp.detach_if_misbehaving(i, now);
        }
        // The TAPs in the ring: the frames its last `enter` collected, at most
        // `TAP_RING_READS` a TAP (one per armed read), so no TAP holds the loop.
        if let Some(taps) = self.taps.as_mut() {
            let (sw, dp, plane) = (&mut self.sw, &mut self.dp, &mut self.plane);
            let mut failed = None;
            let n = taps
                .drain_frames(|file, frame, tx| {
                    let i = dp.tap_slots[file];
                    if let Err(e) = on_vm_frame(sw, dp, (plane.as_mut(), Some(tx)), now, i, frame) {
                        failed = Some(e);
                    }
                })
                .map_err(io_err("re-arming a TAP read"))?;
            busy |= n > 0;
            if let Some(e) = failed {
                self.plane_failed(now, &e);
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

    /// Records from the plane; true if there were any.
    fn poll_plane(&mut self, now: Instant) -> bool {
        let Some(plane) = self.plane.as_mut() else {
            return false;
        };
        let Some(vnic) = plane.vnic.as_mut() else {
            return false;
        };
        let (sw, dp, taps) = (&mut self.sw, &mut self.dp, &mut self.taps);
        let mut busy = false;
        let r = vnic.recv_frames(RING_BATCH, |rec| {
            dp.counters.from_plane += 1;
            let port = PortId(rec.port);
            let gso = VnetHdr::parse(rec.vnet).map_or(0, |h| h.gso_segment());
            match sw.process_from_plane(now, port, rec.msg, gso, rec.frame) {
                Outcome::Forward {
                    port: out,
                    bytes,
                    generated,
                } => {
                    let vnet = if generated { &PLAIN_VNET } else { rec.vnet };
                    dp.write_port(now, taps.as_mut().map(|t| t.tx()), out, vnet, bytes);
                }
                Outcome::Drop(why) => {
                    tracing::debug!(target: "spillway::drop", ?why, len = rec.frame.len(), "the DPU dropped a frame from the plane");
                }
                other => {
                    tracing::error!(target: "spillway::run", outcome = ?other, "a DPU outcome only the plane has");
                }
            }
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
        let r = vnic.recv_control(|c| match c {
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
            sw.dpu_mut().handle_plane_up(now);
        }
        for (m, s) in inbox {
            sw.handle_msg(now, m, s);
        }
        for snap in ct_updates {
            sw.handle_conntrack(now, &snap);
        }
        if let Some(e) = failure {
            self.plane_failed(now, &e);
        }
        busy
    }

    fn plane_failed(&mut self, now: Instant, why: &str) {
        if let Some(mut p) = self.plane.take() {
            self.dp.counters.plane_failures += 1;
            tracing::warn!(target: "spillway::run", reason = why, "spill plane failed; failing open");
            let _ = p.child.kill();
            let _ = p.child.wait();
            self.sw
                .dpu_mut()
                .handle_plane_failed(now, &format!("spill plane failed: {why}"));
        }
    }

    /// Drains the core's outputs after this turn's inputs.
    fn after_input(&mut self, now: Instant) {
        if let Err(e) = send_outgoing(&mut self.sw, self.plane.as_mut(), now) {
            self.plane_failed(now, &e);
        }
        while let Some(cmd) = self.sw.poll_command() {
            match cmd {
                DpuCommand::StartPlane { workers } => self.start_plane(now, workers),
                DpuCommand::StopPlane => self.stop_plane(),
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

    fn start_plane(&mut self, now: Instant, workers: u32) {
        if self.plane.is_some() {
            self.stop_plane();
        }
        let mut cmd = Command::new(&self.plane_exe);
        cmd.arg("spill-plane")
            .arg("--config")
            .arg(&self.tb.file)
            .arg("--vnic-socket")
            .arg(&self.vnic_path)
            .arg("--workers")
            .arg(workers.to_string())
            .arg("--clock-origin-ns")
            .arg(self.clock.origin_ns().to_string());
        // The handshake secret goes to the child on its stdin, a pipe only it inherits: argv
        // and the environment are readable by other users.
        let handed = crate::shm::vnic::new_secret().and_then(|secret| {
            let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
            cmd.stdin(Stdio::from(r));
            Ok((secret, w))
        });
        let (secret, secret_w) = match handed {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(target: "spillway::run", error = %e, "could not make the plane's handshake secret");
                self.sw
                    .dpu_mut()
                    .handle_plane_failed(now, &format!("handshake secret: {e}"));
                return;
            }
        };
        let spawned = match self.ledger.as_mut() {
            Some(l) => l.spawn(&mut cmd).map_err(|e| e.to_string()),
            None => cmd.spawn().map_err(|e| e.to_string()),
        };
        // Drop our copy of the read end (held by `cmd`), then write: 32 bytes fit in any pipe.
        drop(cmd);
        let spawned = spawned.and_then(|child| {
            let mut w = std::fs::File::from(secret_w);
            std::io::Write::write_all(&mut w, &secret)
                .map(|()| child)
                .map_err(|e| format!("handing the plane its secret: {e}"))
        });
        match spawned {
            Ok(child) => {
                let pid = child.id();
                if let Some(cg) = &self.cgroup
                    && let Err(e) = cg.add_pid(pid)
                {
                    tracing::warn!(target: "spillway::run", pid, error = %e, "could not move the spill plane into its cgroup");
                }
                self.dp.counters.plane_starts += 1;
                tracing::info!(target: "spillway::run", pid, workers, at_ms = now.0 as f64 / 1e6, "spill plane started");
                self.plane = Some(PlaneProc {
                    child,
                    secret,
                    vnic: None,
                    up: false,
                    workers,
                    stats: serde_json::Value::Null,
                });
            }
            Err(e) => {
                tracing::error!(target: "spillway::run", error = %e, exe = %self.plane_exe.display(), "could not start the spill plane");
                self.sw
                    .dpu_mut()
                    .handle_plane_failed(now, &format!("could not start the spill plane: {e}"));
            }
        }
    }

    fn stop_plane(&mut self) {
        if let Some(mut p) = self.plane.take() {
            // SIGTERM first: the plane exits by itself; then make sure.
            let pid = p.child.id() as i32;
            // SAFETY: sending a signal to our own child's pid, which we have not reaped yet
            // (so it cannot have been recycled).
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
            loop {
                match p.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    _ => {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        break;
                    }
                }
            }
        }
    }

    /// Accepts the plane's connection; notices its death. Every pending connection is taken:
    /// one from another process (`SO_PEERCRED` pid other than the plane's) is closed at once
    /// and counted, so a flood of them neither delays the plane nor gets anything; the plane's
    /// own must then show the secret it was started with.
    fn manage_plane(&mut self, now: Instant) {
        // A bounded number per turn, so that connections arriving as fast as they are refused
        // cannot keep the loop here.
        for _ in 0..VNIC_ACCEPTS_PER_TURN {
            let Ok((stream, _)) = self.listener.accept() else {
                break;
            };
            let want = self
                .plane
                .as_ref()
                .filter(|p| p.vnic.is_none())
                .map(|p| p.child.id());
            let peer = crate::host::unixsock::peer_cred(&stream);
            match (want, &peer) {
                (Some(pid), Ok(c)) if c.pid == pid => {}
                _ => {
                    self.dp.counters.vnic_rejected += 1;
                    if worth_logging(self.dp.counters.vnic_rejected) {
                        let (pid, uid) = peer.map_or((0, u32::MAX), |c| (c.pid, c.uid));
                        let rejected = self.dp.counters.vnic_rejected;
                        tracing::warn!(target: "spillway::run", pid, uid, expected = ?want, rejected, "refused a vNIC connection that is not from the plane we started");
                    }
                    continue;
                }
            }
            let p = self.plane.as_mut().expect("checked above");
            let checked = crate::shm::vnic::check_auth(
                &stream,
                &p.secret,
                std::time::Duration::from_millis(1000),
            );
            if let Err(e) = checked {
                self.dp.counters.vnic_rejected += 1;
                let e = format!("vNIC handshake: {e}");
                self.plane_failed(now, &e);
                return;
            }
            match VnicSet::create(stream, &format!("workers={}", p.workers)) {
                Ok(mut v) => {
                    // The plane's delivery path, then every attached VM's memory.
                    if let Err(e) = v.send_json(CONTROL_COMMAND, &json!({"vatc": self.vatc})) {
                        let e = e.to_string();
                        self.plane_failed(now, &e);
                        return;
                    }
                    p.vnic = Some(v);
                    self.dp.vm_changes = self
                        .dp
                        .ports
                        .iter()
                        .filter(|p| matches!(&p.io, PortIo::Shm(s) if s.port.is_some()))
                        .map(|p| VmChange::Attached(p.id))
                        .collect();
                    self.tell_plane_vm_changes();
                }
                Err(e) => {
                    let e = e.to_string();
                    self.plane_failed(now, &e);
                    return;
                }
            }
        }
        if let Some(p) = self.plane.as_mut()
            && let Ok(Some(status)) = p.child.try_wait()
        {
            let why = format!("process exited ({status})");
            self.plane_failed(now, &why);
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
        let mut armed = match self.plane.as_mut().and_then(|p| p.vnic.as_mut()) {
            Some(v) => v.prepare_sleep(),
            None => true,
        };
        for p in &mut self.dp.ports {
            if let PortIo::Shm(slot) = &mut p.io
                && let Some(port) = slot.port.as_mut()
            {
                armed &= port.prepare_sleep();
            }
        }
        if !armed {
            self.woke_ports();
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
            };
            set.extend(fd.map(readable));
        }
        if let Some(v) = self.plane.as_ref().and_then(|p| p.vnic.as_ref()) {
            set.extend(v.poll_fds().map(readable));
        }
        set.push(readable(self.listener.as_fd()));
        // SAFETY: `set` holds `set.len()` initialised `pollfd`s; every fd in it belongs to a
        // port, the plane's vNIC or the ctl listener, all owned by `self` and none closed
        // during the call; `poll` only writes the entries' `revents`. The result is not needed:
        // every source is polled again after waking, whatever woke it.
        let _ = unsafe { libc::poll(set.as_mut_ptr(), set.len() as libc::nfds_t, timeout_ms) };
        if let Some(v) = self.plane.as_mut().and_then(|p| p.vnic.as_mut()) {
            v.woke();
        }
        self.woke_ports();
    }

    fn woke_ports(&mut self) {
        for p in &mut self.dp.ports {
            if let PortIo::Shm(slot) = &mut p.io
                && let Some(port) = slot.port.as_mut()
            {
                port.woke();
            }
        }
    }

    /// Shared-memory ports: attaches an endpoint that connected, detaches one that went away,
    /// then tells the plane what changed.
    fn manage_ports(&mut self, now: Instant) {
        for i in 0..self.dp.ports.len() {
            let PortIo::Shm(slot) = &mut self.dp.ports[i].io else {
                continue;
            };
            if slot.port.as_mut().is_some_and(|p| p.endpoint_gone()) {
                self.dp.detach(i, now, DetachReason::Gone);
                continue;
            }
            // A flood on the socket (just read) or bad receive buffers (posted while frames
            // were sent to the VM) since the last turn.
            self.dp.detach_if_misbehaving(i, now);
            let PortIo::Shm(slot) = &mut self.dp.ports[i].io else {
                continue;
            };
            if slot.port.is_some() {
                continue;
            }
            if let Some(until) = slot.quarantine_until {
                if now < until {
                    // Waiting connections stay in the listener's backlog until then.
                    self.dp.counters.vm_attach_quarantined += 1;
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
                                self.dp.counters.vm_rejected += 1;
                                if worth_logging(self.dp.counters.vm_rejected) {
                                    let (pid, uid) = peer.map_or((0, u32::MAX), |c| (c.pid, c.uid));
                                    let rejected = self.dp.counters.vm_rejected;
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
                    if let Err(e) = self.dp.attach(i, *port) {
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
        self.tell_plane_vm_changes();
    }

    /// Sends the plane every shared-memory port change since the last call: an attach hands it
    /// the VM's memory and interrupt eventfd; a detach is a vATC invalidation at the VM's new
    /// epoch.
    fn tell_plane_vm_changes(&mut self) {
        let changes = std::mem::take(&mut self.dp.vm_changes);
        let Some(v) = self.plane.as_mut().and_then(|p| p.vnic.as_mut()) else {
            return;
        };
        let mut failure = None;
        for c in changes {
            let r = match c {
                VmChange::Attached(id) => {
                    let Some(slot) = self.dp.port_slot(id) else {
                        continue;
                    };
                    let PortIo::Shm(s) = &self.dp.ports[slot].io else {
                        continue;
                    };
                    let Some(port) = s.port.as_ref() else {
                        continue;
                    };
                    let vm = vm_id(id);
                    v.send_vm(
                        &VatcMsg::Attach {
                            vm,
                            port: id.0,
                            epoch: self.dp.authority.epoch(vm),
                        },
                        &[port.mem.fd(), port.irq_fd()],
                    )
                }
                VmChange::Detached(id) => {
                    let vm = vm_id(id);
                    self.dp.counters.atc_invalidations += 1;
                    v.send_vm(
                        &VatcMsg::Detach {
                            vm,
                            epoch: self.dp.authority.epoch(vm),
                        },
                        &[],
                    )
                }
            };
            if let Err(e) = r {
                failure = Some(e.to_string());
                break;
            }
        }
        if let Some(e) = failure {
            let now = self.clock.now();
            self.plane_failed(now, &e);
        }
    }

    fn send_plane_command(&mut self, doc: serde_json::Value) -> Result<(), String> {
        match self.plane.as_mut().and_then(|p| p.vnic.as_mut()) {
            Some(v) => v
                .send_json(CONTROL_COMMAND, &doc)
                .map_err(|e| e.to_string()),
            None => Err("no spill plane is running".into()),
        }
    }

    fn serve_ctl(&mut self, now: Instant) {
        while let Some(call) = self.ctl.as_ref().and_then(|c| c.try_recv()) {
            let resp = self.answer(now, &call.request);
            CtlCall::respond(call, resp);
        }
    }

    fn answer(&mut self, now: Instant, req: &CtlRequest) -> CtlResponse {
        match req {
            CtlRequest::Status => CtlResponse::ok(self.status(now)),
            CtlRequest::Vatc { on } => {
                self.vatc = *on;
                let plane = match self.send_plane_command(json!({ "vatc": on })) {
                    Ok(()) => "switched".to_string(),
                    Err(e) => e,
                };
                CtlResponse::ok(json!({ "vatc": on, "plane": plane }))
            }
            CtlRequest::Metrics => {
                let mut v = Vec::new();
                self.fill_samples(&mut v);
                let m: BTreeMap<String, f64> = v
                    .iter()
                    .filter(|s| s.labels.is_empty())
                    .map(|s| (s.name.to_string(), sample_f64(&s.value)))
                    .collect();
                CtlResponse::ok(json!(m))
            }
            CtlRequest::Flows { limit, owner } => CtlResponse::ok(self.flow_dump(*limit, *owner)),
            CtlRequest::Activate => {
                self.sw.dpu_mut().handle_hold(now, Hold::Active);
                self.after_input(now);
                CtlResponse::ok(json!({"hold": "active", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::Release => {
                self.sw.dpu_mut().handle_hold(now, Hold::Released);
                self.after_input(now);
                CtlResponse::ok(json!({"hold": "released", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::Prepare => {
                self.sw.dpu_mut().handle_hold(now, Hold::Shadow);
                self.after_input(now);
                CtlResponse::ok(json!({"hold": "shadow", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::Auto => {
                self.sw.dpu_mut().handle_hold(now, Hold::Auto);
                CtlResponse::ok(json!({"hold": "auto", "phase": self.sw.dpu().phase().name()}))
            }
            CtlRequest::SetPolicy { placement } => {
                let Some((_, kind)) = PlacementKind::NAMES.iter().find(|(n, _)| n == placement)
                else {
                    let names: Vec<&str> = PlacementKind::NAMES.iter().map(|(n, _)| *n).collect();
                    return CtlResponse::error(format!(
                        "unknown placement policy {placement:?}; expected one of {}",
                        names.join(", ")
                    ));
                };
                self.tb.fabric.placement.policy = *kind;
                let sent = self.send_plane_command(json!({"set_placement": placement}));
                CtlResponse::ok(
                    json!({"placement": placement, "plane": sent.err().unwrap_or_else(|| "updated".into())}),
                )
            }
            CtlRequest::Reload => {
                let tb = match Testbed::load(&self.tb.file) {
                    Ok(t) => t,
                    Err(e) => return CtlResponse::error(e.to_string()),
                };
                let policy: Policy = tb.policy.clone();
                self.sw.set_policy(policy);
                self.tb.policy_text = tb.policy_text.clone();
                self.tb.policy = tb.policy;
                let sent = self.send_plane_command(json!({"set_policy": tb.policy_text}));
                CtlResponse::ok(json!({
                    "epoch": self.sw.pipeline().epoch().0,
                    "plane": sent.err().unwrap_or_else(|| "updated".into()),
                }))
            }
        }
    }

    fn status(&mut self, now: Instant) -> serde_json::Value {
        let dpu = self.sw.dpu();
        let last = self.events.back();
        let counters: BTreeMap<String, u64> = dpu
            .counters()
            .iter()
            .map(|(k, v)| (k.to_string(), v))
            .chain(self.rt_counters())
            .collect();
        json!({
            "testbed": self.tb.name,
            "uptime_s": now.0 as f64 / 1e9,
            "phase": dpu.phase().name(),
            "hold": dpu.hold().name(),
            "reason": last.map(|e| e.reason.clone()),
            "last_event": last.map(|e| e.what.name()),
            "quota_buckets": dpu.quota(),
            "redirect_buckets": self.tb.fabric.dpu.redirect_buckets,
            "hw_entries": dpu.hw_entries(),
            "hw_capacity": dpu.hw_capacity(),
            "epoch": self.sw.pipeline().epoch().0,
            "placement": self.tb.fabric.placement.policy.name(),
            "vatc": self.vatc,
            "vm_ports": self.dp.ports.iter().filter_map(|p| match &p.io {
                PortIo::Shm(s) => Some(json!({
                    "vm": s.vm, "port": p.id.0, "attached": s.port.is_some(),
                    "epoch": self.dp.authority.epoch(vm_id(p.id)).0,
                    "rx_no_buffer": s.port.as_ref().map(|x| x.rx_no_buffer),
                    "bad_desc": s.port.as_ref().map(|x| x.bad_desc),
                })),
                PortIo::Tap(_) => None,
            }).collect::<Vec<_>>(),
            "metrics_addr": self.metrics.as_ref().map(|m| m.local_addr().to_string()),
            "plane": self.plane.as_ref().map(|p| json!({
                "pid": p.child.id(),
                "up": p.up,
                "connected": p.vnic.is_some(),
                "stats": p.stats,
            })),
            "rates_per_s": self.rates.per_sec,
            // Allocations of the forwarding thread outside upkeep (see `host::allocs` and
            // `upkeep`), up to the start of the upkeep that answers this request.
            "forwarding_allocs": self.upkeep_mark - self.upkeep_allocs,
            "upkeep_allocs": self.upkeep_allocs,
            "counters": counters,
            "drops": dpu.drops().iter().filter(|(_, v)| *v > 0).collect::<BTreeMap<_, _>>(),
            "vswitch_drops": self.sw.pipeline().drops().iter().filter(|(_, v)| *v > 0).collect::<BTreeMap<_, _>>(),
            "activations": self.activations,
            "events": self.events.iter().rev().map(|e| json!({
                "at_s": e.at.0 as f64 / 1e9, "event": e.what.name(), "reason": e.reason,
            })).collect::<Vec<_>>(),
        })
    }

    fn flow_dump(&self, limit: Option<usize>, owner: Option<FlowOwner>) -> serde_json::Value {
        let limit = limit.unwrap_or(FLOWS_LIMIT_DEFAULT).min(FLOWS_LIMIT_MAX);
        let quota = self.sw.dpu().quota();
        let buckets = self.tb.fabric.dpu.redirect_buckets;
        let mut rows = Vec::new();
        for (conn, c) in self.sw.dpu().conns_sorted() {
            let (who, why) = match (c.role, c.hw_live) {
                (Role::Owner, n) if n > 0 => (
                    FlowOwner::DpuHw,
                    if c.recalled {
                        "recalled to the fast path by the plane's placement".to_string()
                    } else {
                        "fast-path entries installed by the SoC slow path".to_string()
                    },
                ),
                (Role::Owner, _) if c.inserts_pending > 0 => {
                    (FlowOwner::DpuSoc, "hardware inserts pending".to_string())
                }
                (Role::Owner, _) => (
                    FlowOwner::DpuSoc,
                    "no hardware entry (table full, memory, or insertion budget)".to_string(),
                ),
                (Role::Copy, _) => (
                    FlowOwner::Spill,
                    if conn.bucket(buckets) < quota {
                        format!(
                            "redirected: bucket {} < quota {quota}",
                            conn.bucket(buckets)
                        )
                    } else {
                        "handed to the plane (shed from the fast path or opened while redirected)"
                            .to_string()
                    },
                ),
            };
            if owner.is_some_and(|o| o != who) {
                continue;
            }
            let key = self.sw.conns().get(conn).map(|r| {
                format!(
                    "{}:{} > {}:{} proto {}",
                    r.orig.src_ip.to_std(),
                    r.orig.src_port,
                    r.orig.dst_ip.to_std(),
                    r.orig.dst_port,
                    r.orig.proto
                )
            });
            rows.push(json!({
                "conn": conn.0, "flow": key, "tenant": c.state.tenant.0, "owner": who.name(), "why": why,
                "packets": c.state.packets, "phase": format!("{:?}", c.state.phase),
            }));
            if rows.len() >= limit {
                break;
            }
        }
        json!({ "flows": rows, "total": self.sw.dpu().conns_len() })
    }

    fn fill_samples(&self, out: &mut Vec<Sample>) {
        let dpu = self.sw.dpu();
        for (n, v) in dpu.counters().iter() {
            out.push(Sample::counter(n, v));
        }
        for (n, v) in dpu.drops().iter() {
            out.push(
                Sample::counter(n, v)
                    .with_help("packets a DPU limit dropped")
                    .with_label("layer", "fabric"),
            );
        }
        for (n, v) in self.rt_counters() {
            out.push(Sample::counter(n, v));
        }
        for (n, v) in self.ctl.iter().flat_map(|c| c.refused()) {
            out.push(Sample::counter(n, v).with_help("control connections refused"));
        }
        for (n, v) in self.sw.pipeline().drops().iter() {
            out.push(
                Sample::counter(n, v)
                    .with_help("frames the DPU's vSwitch pipeline dropped")
                    .with_label("plane", "dpu"),
            );
        }
        for (n, v) in self.sw.pipeline().neigh_counters().iter() {
            out.push(
                Sample::counter(n, v)
                    .with_help("ARP and neighbour discovery the DPU's vSwitch answered or took")
                    .with_label("plane", "dpu"),
            );
        }
        for (n, v) in self.sw.pipeline().icmp_error_counters().iter() {
            out.push(
                Sample::counter(n, v)
                    .with_help("ICMP errors the DPU's vSwitch router sent or held back")
                    .with_label("plane", "dpu"),
            );
        }
        for (n, v) in self.sw.pipeline().frag_counters().iter() {
            out.push(
                Sample::counter(n, v)
                    .with_help("IP fragments the DPU's vSwitch tracked")
                    .with_label("plane", "dpu"),
            );
        }
        out.push(Sample::gauge("dpu.hw.entries", dpu.hw_entries() as f64));
        out.push(Sample::gauge("dpu.hw.capacity", dpu.hw_capacity() as f64));
        out.push(Sample::gauge("dpu.redirect.quota", f64::from(dpu.quota())));
        out.push(Sample::gauge("dpu.conns", dpu.conns_len() as f64));
        out.push(Sample::gauge(
            "spill.up",
            if self.plane.as_ref().is_some_and(|p| p.up) {
                1.0
            } else {
                0.0
            },
        ));
        out.extend(Sample::state_set(
            "fabric.phase",
            "phase",
            &[
                "idle",
                "preparing",
                "shadow",
                "activating",
                "active",
                "draining",
            ],
            dpu.phase().name(),
        ));
        if let Some(p) = &self.plane
            && let Some(obj) = p.stats.get("counters").and_then(|c| c.as_object())
        {
            for (k, v) in obj {
                if let Some(v) = v.as_u64() {
                    out.push(Sample::counter(k.clone(), v));
                }
            }
        }
    }

    /// The process's own counters under `rt.`: what the driver moved, and what became of the
    /// frames inside the DPU node.
    fn rt_counters(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        let node = self.sw.counters().iter(self.sw.conns().counters());
        let ring = self.taps.iter().flat_map(|t| t.counters().iter());
        self.dp
            .counters
            .iter()
            .chain(ring)
            .map(|(k, v)| (k.to_string(), v))
            .chain(node.map(|(k, v)| (format!("rt.{k}"), v)))
    }

    fn publish(&mut self, now: Instant) {
        self.last_publish = now;
        // Connections that never close (UDP) or whose close was not seen are forgotten after
        // two minutes idle, a bounded slice per call.
        self.sw.expire(now);
        let mut samples = Vec::new();
        self.fill_samples(&mut samples);
        self.publisher
            .publish(|out| out.extend(samples.iter().cloned()));
        // Rates once a second.
        if now.0.saturating_sub(self.rates.at.0) >= 1_000_000_000 {
            let secs = (now.0 - self.rates.at.0) as f64 / 1e9;
            let mut cur: BTreeMap<String, u64> = self
                .sw
                .dpu()
                .counters()
                .iter()
                .map(|(k, v)| (k.to_string(), v))
                .chain(self.rt_counters())
                .collect();
            if let Some(obj) = self
                .plane
                .as_ref()
                .and_then(|p| p.stats.get("counters"))
                .and_then(|c| c.as_object())
            {
                cur.extend(
                    obj.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?))),
                );
            }
            self.rates.per_sec = cur
                .iter()
                .filter_map(|(k, v)| {
                    let b = self.rates.base.get(k)?;
                    Some((k.clone(), v.saturating_sub(*b) as f64 / secs))
                })
                .filter(|(_, r)| *r > 0.0)
                .collect();
            self.rates.base = cur;
            self.rates.at = now;
        }
    }

    fn teardown(&mut self) -> RunReport {
        self.stop_plane();
        self.ctl.take();
        self.metrics.take();
        let counters = self.rt_counters().collect();
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
