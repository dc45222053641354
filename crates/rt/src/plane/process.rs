//! The spill-plane process (`spillway spill-plane`), started by the DPU process in its own
//! cgroup: the core's host-side frame node ([`PlaneSwitch`]: the `SpillPlane` model with its
//! own vSwitch pipeline) on the plane's end of the vNIC set.
//!
//! Per loop turn: frames steered to it from the phy ring, each handed to the node, whose one
//! [`Outcome`] this loop carries out (back on the phy ring with the port it leaves by, straight
//! into a VM's memory through the vATC, or punted back whole); records from the flow ring and
//! the control socket, handed to the node in the order they came; the model's timers; the
//! node's messages (their snapshots attached by the node); every 500 ms its counters to the
//! DPU process. It sleeps in `poll` on its doorbell and the control socket. It exits on
//! SIGTERM, or when the DPU process closes the control socket.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde_json::json;
use std::sync::{Arc, Mutex};

use spillway_fabric::frame::{Outcome, PlaneModel, PlaneShardModel, PlaneSwitch, shard_capacities};
use spillway_fabric::params::PlacementKind;
use spillway_fabric::spill::{
    PlaneResources, PlaneResourcesHandle, PlaneShard, PlaneView, SpillPlane,
};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PortId};

use crate::dpu::vmport::{DirectRefused, PlaneVm};
use crate::host::allocs;
use crate::host::clock::Clock;
use crate::host::signals;
use crate::host::vnet::VnetHdr;
use crate::plane::threads::{self, PlaneThreads, ThreadSpec, ToMain};
use crate::shards::{Bell, Shared, ThreadShards};
use crate::shm::codec::VatcMsg;
use crate::shm::vnic::{CONTROL_COMMAND, CONTROL_STATS, Control, FlowRecord, VnicLane, VnicSet};
use crate::testbed::Testbed;
use crate::vm::vhost_user::lend::PlaneGuest;
use spillway_fabric::atc::{Atc, AtcConfig, Iova, VmId};
use std::collections::{BTreeMap, BTreeSet};

/// Options of `spillway spill-plane`.
#[derive(Debug)]
pub struct PlaneOptions {
    /// The testbed file (policy and fabric parameters).
    pub config: PathBuf,
    /// The DPU process's vNIC socket.
    pub vnic_socket: PathBuf,
    /// Workers to start with.
    pub workers: u32,
    /// The DPU process's clock origin.
    pub clock_origin_ns: u64,
    /// Run the plane on a pool host instead, and relay its records ([`crate::remote::relay`]).
    pub remote: Option<crate::remote::relay::RemoteOptions>,
}

/// A spill plane about to start: its command (`spillway spill-plane` with its options) and the
/// handshake secret it will read on stdin, a pipe only it inherits (argv and the environment
/// are readable by other users). The DPU process and a pool host's service start planes this
/// one way; [`connect`] is the other end.
pub(crate) struct Launch {
    /// The command; spawn it, then drop it (it holds the pipe's read end).
    pub(crate) cmd: std::process::Command,
    /// The secret the plane must show on the vNIC socket.
    pub(crate) secret: [u8; crate::shm::vnic::SECRET_LEN],
    /// The pipe's write end: [`hand_secret`] it once the plane is in its cgroup.
    pub(crate) secret_w: std::os::fd::OwnedFd,
}

/// The launch of `exe`'s spill plane on testbed `config` and vNIC socket `vnic_socket`.
pub(crate) fn launch(
    exe: &std::path::Path,
    config: &std::path::Path,
    vnic_socket: &std::path::Path,
    workers: u32,
    clock_origin_ns: u64,
) -> std::io::Result<Launch> {
    let secret = crate::shm::vnic::new_secret()?;
    let (r, secret_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("spill-plane")
        .arg("--config")
        .arg(config)
        .arg("--vnic-socket")
        .arg(vnic_socket)
        .arg("--workers")
        .arg(workers.to_string())
        .arg("--clock-origin-ns")
        .arg(clock_origin_ns.to_string())
        .stdin(std::process::Stdio::from(r));
    Ok(Launch {
        cmd,
        secret,
        secret_w,
    })
}

/// Writes the secret, and `extra` after it (a relay's token), to the plane's stdin and closes
/// it. A few hundred bytes fit in any pipe: this never waits on the plane.
pub(crate) fn hand_secret(
    secret_w: std::os::fd::OwnedFd,
    secret: &[u8; crate::shm::vnic::SECRET_LEN],
    extra: &[u8],
) -> std::io::Result<()> {
    let mut handed = Vec::with_capacity(secret.len() + extra.len());
    handed.extend_from_slice(secret);
    handed.extend_from_slice(extra);
    std::io::Write::write_all(&mut std::fs::File::from(secret_w), &handed)
}

spillway_vswitch::counters! {
    /// Plane-process counters (`plane.*`, sent to the DPU process for its metrics): what the
    /// driver moved. What became of each frame inside the plane is the node's
    /// ([`spillway_fabric::frame::FrameCounters`], also sent under `plane.`).
    #[derive(Copy)]
    pub(crate) struct PlaneCounters {
        /// Frames the DPU steered to the plane.
        frames_in => "plane.frames.in",
        /// Frames sent back on the phy ring.
        frames_out => "plane.frames.out",
        /// Frames punted back whole to the DPU.
        punted => "plane.frames.punted",
        /// Frames not sent back because the phy ring was full.
        drop_ring_full => "plane.drop.ring_full",
        /// Frames delivered straight into a VM's memory.
        vatc_delivered => "plane.vatc.delivered",
        /// Direct deliveries refused for want of a translation (a request is queued).
        vatc_miss => "plane.vatc.miss",
        /// Direct deliveries refused because the VM had no receive buffer posted.
        vatc_no_buffer => "plane.vatc.no_buffer",
        /// Direct deliveries refused for a bad receive descriptor.
        vatc_bad_desc => "plane.vatc.bad_desc",
        /// Direct deliveries to a port whose memory the plane does not hold.
        vatc_no_port => "plane.vatc.no_port",
        /// VMs whose receive queue was broken; their memory was dropped.
        vatc_broken => "plane.vatc.broken",
        /// Direct deliveries to a guest whose queue the DPU process had taken back (it is
        /// being reconfigured) or the other plane held.
        vatc_not_lent => "plane.vatc.not_lent",
        /// Frames for a guest sent the DPU way for their offloads (a checksum to complete).
        vatc_offload => "plane.vatc.offload"
        ,
        /// vATC invalidations (detaches) received from the DPU process.
        vatc_invalidations => "plane.vatc.invalidations",
    }
}

/// A VM the plane delivers into: a shared-memory VM's queue 2, or a vhost-user guest's
/// receive queue 1 lent by the DPU process.
#[derive(Debug)]
enum Direct {
    Shm(PlaneVm),
    Guest(PlaneGuest),
}

impl Direct {
    fn vm(&self) -> VmId {
        match self {
            Direct::Shm(v) => v.vm,
            Direct::Guest(g) => g.vm,
        }
    }

    fn epoch_mut(&mut self) -> &mut spillway_fabric::atc::AtcEpoch {
        match self {
            Direct::Shm(v) => &mut v.epoch,
            Direct::Guest(g) => &mut g.epoch,
        }
    }

    fn deliver(
        &mut self,
        atc: &mut Atc,
        vnet: &[u8; 12],
        frame: &[u8],
    ) -> Result<(), DirectRefused> {
        match self {
            Direct::Shm(v) => v.deliver(atc, vnet, frame),
            Direct::Guest(g) => g.deliver(atc, vnet, frame),
        }
    }

    fn flush_irq(&mut self) {
        match self {
            Direct::Shm(v) => v.flush_irq(),
            Direct::Guest(g) => g.flush_irq(),
        }
    }
}

/// The plane's side of the vATC: the VMs whose memory it holds (by the port they are), the
/// translation cache, and the VMs with a translation request outstanding.
pub(crate) struct Vatc {
    vms: BTreeMap<PortId, Direct>,
    atc: Atc,
    pending: BTreeSet<u32>,
    requests: Vec<(VmId, Iova, u64)>,
}

impl Vatc {
    /// Delivers a processed frame into VM `out`'s memory; false if the caller must send it the
    /// DPU way (counted by reason; a miss queues a translation request).
    pub(crate) fn deliver(
        &mut self,
        out: PortId,
        vnet: &[u8; 12],
        frame: &[u8],
        c: &mut PlaneCounters,
    ) -> bool {
        let Some(vm) = self.vms.get_mut(&out) else {
            c.vatc_no_port += 1;
            return false;
        };
        match vm.deliver(&mut self.atc, vnet, frame) {
            Err(DirectRefused::NotLent) => {
                c.vatc_not_lent += 1;
                false
            }
            Err(DirectRefused::Offload) => {
                c.vatc_offload += 1;
                false
            }
            Ok(()) => {
                c.vatc_delivered += 1;
                true
            }
            Err(DirectRefused::Miss(m)) => {
                c.vatc_miss += 1;
                if self.pending.insert(vm.vm().0) {
                    for r in m.missing() {
                        self.requests.push((vm.vm(), r.start, r.len));
                    }
                }
                false
            }
            Err(DirectRefused::NoBuffer) => {
                c.vatc_no_buffer += 1;
                false
            }
            Err(DirectRefused::BadDesc) => {
                c.vatc_bad_desc += 1;
                false
            }
            Err(DirectRefused::Broken) => {
                c.vatc_broken += 1;
                let vm = vm.vm();
                tracing::warn!(target: "spillway::plane", vm = vm.0, "VM receive queue broken; dropping its memory");
                self.vms.remove(&out);
                self.atc.invalidate_vm(vm);
                false
            }
        }
    }

    /// A [`crate::shm::vnic::CONTROL_VM`] record from the DPU process.
    fn on_control(&mut self, msg: VatcMsg, fds: Vec<std::os::fd::OwnedFd>, c: &mut PlaneCounters) {
        match msg {
            VatcMsg::Attach { vm, epoch, .. } => {
                let port = PortId(vm.0);
                let mut fds = fds.into_iter();
                let (Some(mem), Some(irq)) = (fds.next(), fds.next()) else {
                    tracing::warn!(target: "spillway::plane", vm = vm.0, "attach without its fds; ignored");
                    return;
                };
                let mem = match crate::shm::virtq::VmMemory::from_fd(mem) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(target: "spillway::plane", vm = vm.0, error = %e, "VM memory refused");
                        return;
                    }
                };
                let Ok(irq) = crate::shm::ring::Doorbell::from_fd(irq) else {
                    return;
                };
                // New memory: whatever was cached for the VM is dead. Ask for the translation
                // of its receive queue 2 now, before the first packet needs it, so that packet
                // does not have to go the DPU way for want of it.
                self.atc.invalidate_vm(vm);
                let l = *mem.layout();
                let queue2 = crate::shm::virtq::QUEUE_RX_PLANE;
                self.pending.insert(vm.0);
                self.requests
                    .push((vm, Iova(l.iova(l.bufs_off(queue2))), l.bufs_len() as u64));
                self.vms
                    .insert(port, Direct::Shm(PlaneVm::new(vm, mem, irq, epoch)));
                tracing::info!(target: "spillway::plane", vm = vm.0, epoch = epoch.0, "VM memory mapped");
            }
            VatcMsg::AttachGuest {
                vm,
                port,
                epoch,
                lend,
            } => {
                let me = std::process::id();
                let number = lend.number;
                let g = match PlaneGuest::new(vm, epoch, &lend, fds, me) {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::warn!(target: "spillway::plane", vm = vm.0, error = %e, "guest memory refused");
                        return;
                    }
                };
                // New memory: whatever was cached for the guest is dead; ask for the whole of
                // it now, before the first frame needs it.
                self.atc.invalidate_vm(vm);
                let (iova, len) = g.span();
                self.pending.insert(vm.0);
                self.requests.push((vm, iova, len));
                self.vms.insert(PortId(port), Direct::Guest(g));
                tracing::info!(target: "spillway::plane", vm = vm.0, epoch = epoch.0, lend = number, "guest receive queue 1 lent");
            }
            VatcMsg::Detach { vm, epoch } => {
                c.vatc_invalidations += 1;
                self.vms.remove(&PortId(vm.0));
                self.atc.invalidate_vm(vm);
                self.pending.remove(&vm.0);
                tracing::info!(target: "spillway::plane", vm = vm.0, epoch = epoch.0, "VM memory invalidated");
            }
            VatcMsg::Regions {
                vm,
                epoch,
                iova,
                len,
                regions,
            } => {
                self.pending.remove(&vm.0);
                let Some(v) = self.vms.get_mut(&PortId(vm.0)) else {
                    return;
                };
                let e = v.epoch_mut();
                if epoch < *e {
                    return; // an answer from before the VM's last change
                }
                *e = epoch;
                // The answer lists all the VM's regions: what it leaves out of the asked range
                // is known unmapped at this epoch (a negative entry), so a buffer posted there
                // is refused from now on instead of asked about with every packet.
                if let Err(e) = self.atc.fill_map(vm, epoch, regions.iter(), iova, len) {
                    tracing::warn!(target: "spillway::plane", vm = vm.0, error = %e, "translation refused");
                }
            }
            VatcMsg::Translate { vm, .. } => {
                tracing::warn!(target: "spillway::plane", vm = vm.0, "a translation request from the DPU process; ignored");
            }
        }
    }
}

/// The plane process's state: the core's frame node (the control part with every shard, or
/// with shard 0 and the others on threads), its end of the vNIC set, the vATC, and the
/// buffers a loop turn reuses.
struct PlaneProcess<R: PlaneResourcesHandle> {
    sw: PlaneSwitch<SpillPlane<R>>,
    vnic: VnicSet,
    vatc: Arc<Mutex<Vatc>>,
    c: PlaneCounters,
    /// The shard threads, with `fabric.dpu.shards > 1`.
    threads: Option<PlaneThreads>,
    /// The vATC's translation requests being sent to the DPU process.
    translate: Vec<(VmId, Iova, u64)>,
    /// Flow-ring and control records of this turn, in arrival order.
    records: Vec<FlowRecord>,
    commands: Vec<serde_json::Value>,
    last_stats: Instant,
    /// Buckets of the redirect rules: with the set's lanes, which lane an output goes on.
    buckets: u16,
    /// The descriptors `sleep` polls (every lane's doorbell held here, the shard threads'
    /// bell and the control socket), rebuilt in place: the loop sleeps between batches under
    /// paced traffic.
    poll_set: Vec<libc::pollfd>,
    /// This thread's allocations in upkeep (expiry, the stats report), apart from
    /// forwarding's, reported as `forwarding_allocs`.
    allocs: allocs::Upkeep,
}

/// Runs the plane until SIGTERM or the DPU process goes away.
pub fn run(opts: PlaneOptions) -> Result<(), String> {
    if let Some(remote) = &opts.remote {
        return crate::remote::relay::run(&opts, remote);
    }
    disable_huge_pages()?;
    let tb = Testbed::load(&opts.config).map_err(|e| e.to_string())?;
    let mut vnic = connect(&opts)?;
    let shards = tb.fabric.dpu.shards.max(1) as usize;
    if vnic.lanes() != shards {
        return Err(format!(
            "the DPU process offers {} vNIC lanes, {} says fabric.dpu.shards = {shards}",
            vnic.lanes(),
            opts.config.display()
        ));
    }
    let clock = Clock::with_origin(opts.clock_origin_ns);
    let vatc = Arc::new(Mutex::new(Vatc {
        vms: BTreeMap::new(),
        atc: Atc::new(AtcConfig::default()).expect("the default config is valid"),
        pending: BTreeSet::new(),
        requests: Vec::with_capacity(16),
    }));
    if shards == 1 {
        let sw = node(SpillPlane::new(&tb.fabric), &tb)?;
        let mut p = PlaneProcess::new(sw, vnic, vatc, &tb);
        p.sw.plane_mut().start(clock.now(), opts.workers.max(1));
        drop_privileges(&tb)?;
        return p.run(&clock);
    }
    // Shards 1.. on threads of their own, each with its lane; the control part and shard 0
    // here. The threads start once privileges are dropped.
    let f = &tb.fabric;
    let res = Shared::new(PlaneResources::new(f, opts.workers.max(1)));
    let mut transport = ThreadShards::new();
    let mut specs = Vec::new();
    // A plane that has not started; each thread picks up the control part's view at its
    // first turn.
    let view = PlaneView {
        colour: spillway_fabric::types::Colour(0),
        active: false,
        releasing: false,
        vatc: f.host.vatc,
    };
    for lane in vnic.take_lanes() {
        let k = lane.index();
        let bell = Arc::new(Bell::new().map_err(|e| format!("eventfd: {e}"))?);
        let waker = Arc::clone(&bell);
        let end = transport.add(move || waker.ring());
        let shard = PlaneShard::new(f, k as u16, shards);
        specs.push(ThreadSpec {
            sw: node(PlaneShardModel::new(shard, view, res.share()), &tb)?,
            lane,
            end,
            bell,
        });
    }
    let main_bell = Arc::new(Bell::new().map_err(|e| format!("eventfd: {e}"))?);
    let sw = node(SpillPlane::with_remote(f, res, Box::new(transport)), &tb)?;
    let mut p = PlaneProcess::new(sw, vnic, Arc::clone(&vatc), &tb);
    p.sw.plane_mut().start(clock.now(), opts.workers.max(1));
    drop_privileges(&tb)?;
    let view = p.sw.plane().view();
    let threads = threads::spawn(specs, main_bell, view, vatc, (clock, p.buckets))
        .map_err(|e| format!("starting the plane's shard threads: {e}"))?;
    tracing::info!(target: "spillway::plane", shards, "one thread per shard");
    p.threads = Some(threads);
    let r = p.run(&clock);
    if let Some(mut t) = p.threads.take() {
        t.stop();
    }
    r
}

/// A frame node over `model` with the testbed's policy: the plane's, or one shard's (with its
/// share of the tables, [`shard_capacities`]).
fn node<M: PlaneModel>(model: M, tb: &Testbed) -> Result<PlaneSwitch<M>, String> {
    let (config, conns_max) = shard_capacities(tb.fabric.dpu.shards as usize);
    PlaneSwitch::with_model(model, tb.policy.clone(), config, conns_max)
        .map_err(|e| format!("pipeline: {e}"))
}

/// Turns transparent huge pages off for this process, before its tables are allocated.
///
/// The plane's tables (classifier, conntrack, flow entries) are reserved at start and touched
/// as connections arrive, at random places. With huge pages, each first touch of a 2 MiB
/// region faults and zeroes it whole: when a flood's first connections reached a fresh plane,
/// it spent 20-25 ms in those faults (`clear_page_erms` under `ConnTable::learn` in a
/// profile), missed three 5 ms heartbeats, and the DPU failed it open (about one run in three
/// of `bench/flood-per-core.sh --modes plane`). With 4 KiB pages the same zeroing is spread
/// over the connections that need it.
fn disable_huge_pages() -> Result<(), String> {
    rustix::thread::disable_transparent_huge_pages(true)
        .map_err(|e| format!("prctl(PR_SET_THP_DISABLE): {e}"))
}

/// Connects to the DPU process's vNIC socket and maps the vNIC set. The handshake secret comes
/// on stdin, a pipe from the DPU process that started us, and is handed only to that process
/// (checked by the socket peer's pid), not to whoever listens at the path.
fn connect(opts: &PlaneOptions) -> Result<VnicSet, String> {
    let mut secret = [0u8; crate::shm::vnic::SECRET_LEN];
    std::io::Read::read_exact(&mut std::io::stdin().lock(), &mut secret).map_err(|e| {
        format!(
            "reading the vNIC handshake secret from stdin: {e} (the spill plane is started by \
             `spillway run`, which hands it the secret)"
        )
    })?;
    let stream = UnixStream::connect(&opts.vnic_socket)
        .map_err(|e| format!("connecting to {}: {e}", opts.vnic_socket.display()))?;
    check_parent(&stream, &opts.vnic_socket)?;
    crate::shm::vnic::send_auth(&stream, &secret).map_err(|e| e.to_string())?;
    let (vnic, hello) = VnicSet::accept(stream).map_err(|e| e.to_string())?;
    tracing::info!(target: "spillway::plane", pid = std::process::id(), hello = %hello, "vNIC set mapped");
    Ok(vnic)
}

/// Whether the vNIC socket `path`, connected as `stream`, is served by our parent (the DPU
/// process that started us, and the only one to get the secret).
pub(crate) fn check_parent(stream: &UnixStream, path: &std::path::Path) -> Result<(), String> {
    let server = crate::host::unixsock::peer_cred(stream)
        .map_err(|e| format!("credentials of {}: {e}", path.display()))?;
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
    if server.pid != parent {
        return Err(format!(
            "{} is served by pid {} (uid {}), not by our parent {parent}; not handing it the secret",
            path.display(),
            server.pid,
            server.uid
        ));
    }
    Ok(())
}

/// The virtio-net header of a frame with nothing offloaded.
const PLAIN_VNET: [u8; 12] = [0; 12];

/// Frames the DPU steered here on `lane`, each through the node and on, from the receive ring
/// straight onto the lane's send ring (or into the VM's memory); returns how many. What
/// comes in on a lane goes back on it. The main thread and every shard thread serve their
/// lanes with this.
pub(crate) fn serve_lane_frames<M: PlaneModel>(
    sw: &mut PlaneSwitch<M>,
    lane: &mut VnicLane,
    vatc: &Mutex<Vatc>,
    c: &mut PlaneCounters,
    now: Instant,
) -> Result<usize, crate::shm::vnic::VnicError> {
    let mut direct = false;
    let n = lane.recv_frames_tx(256, |rec, tx| {
        c.frames_in += 1;
        let gso = VnetHdr::parse(rec.vnet).map_or(0, |h| h.gso_segment());
        let vnet = rec.vnet;
        let header = |generated: bool| if generated { &PLAIN_VNET } else { vnet };
        let mut outcome = sw.process(now, PortId(rec.port), rec.msg, gso, rec.frame);
        if let Outcome::Direct {
            port,
            bytes,
            generated,
        } = outcome
        {
            direct = true;
            let mut v = vatc.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if v.deliver(port, header(generated), bytes, c) {
                return;
            }
            drop(v);
            outcome = sw.direct_refused(now);
        }
        match outcome {
            Outcome::Return {
                msg,
                port,
                bytes,
                generated,
            } => {
                if tx.send_frame(&msg, port.0, header(generated), bytes) {
                    c.frames_out += 1;
                } else {
                    c.drop_ring_full += 1;
                }
            }
            Outcome::Punt { msg } => {
                c.punted += 1;
                if !tx.send_frame(&msg, rec.port, vnet, rec.frame) {
                    c.drop_ring_full += 1;
                }
            }
            Outcome::Drop(why) => {
                tracing::debug!(target: "spillway::drop", ?why, len = rec.frame.len(), "the plane dropped a frame");
            }
            other => {
                tracing::error!(target: "spillway::plane", outcome = ?other, "an outcome only the DPU has");
            }
        }
    })?;
    if direct {
        let mut v = vatc
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for vm in v.vms.values_mut() {
            vm.flush_irq();
        }
    }
    Ok(n)
}

impl<R: PlaneResourcesHandle> PlaneProcess<R> {
    fn new(
        sw: PlaneSwitch<SpillPlane<R>>,
        vnic: VnicSet,
        vatc: Arc<Mutex<Vatc>>,
        tb: &Testbed,
    ) -> PlaneProcess<R> {
        let lanes = vnic.lanes();
        PlaneProcess {
            sw,
            vnic,
            vatc,
            c: PlaneCounters::default(),
            threads: None,
            translate: Vec::with_capacity(16),
            records: Vec::with_capacity(256),
            commands: Vec::new(),
            last_stats: Instant::ZERO,
            buckets: tb.fabric.dpu.redirect_buckets,
            poll_set: Vec::with_capacity(lanes + 2),
            allocs: allocs::Upkeep::default(),
        }
    }

    fn run(&mut self, clock: &Clock) -> Result<(), String> {
        loop {
            if signals::stop_requested() {
                tracing::info!(target: "spillway::plane", "stopping on signal");
                return Ok(());
            }
            let now = clock.now();
            let frames = self.on_frames(now).map_err(|e| e.to_string())?;
            let records = match self.on_records(now) {
                Ok(n) => n,
                Err(crate::shm::vnic::VnicError::Closed) => {
                    tracing::info!(target: "spillway::plane", "DPU process closed the control socket; exiting");
                    return Ok(());
                }
                Err(e) => return Err(e.to_string()),
            };
            let relayed = self.on_threads()?;
            if self.sw.poll_timeout().is_some_and(|t| t <= now) {
                self.sw.plane_mut().handle_timeout(now);
            }
            self.send_outgoing(now).map_err(|e| e.to_string())?;
            if let Some(t) = self.threads.as_mut() {
                t.publish_view(self.sw.plane().view());
            }
            if now.0.saturating_sub(self.last_stats.0) >= 500_000_000 {
                self.last_stats = now;
                let mark = self.allocs.begin();
                self.sw.expire(now);
                self.send_stats().map_err(|e| e.to_string())?;
                self.allocs.end(mark);
            }
            if frames == 0 && records == 0 && relayed == 0 {
                self.sleep(now)?;
            }
        }
    }

    /// Frames the DPU steered here on the lanes this thread holds (lane 0, or all of them with
    /// one shard), then the vATC's translation requests; returns how many frames.
    fn on_frames(&mut self, now: Instant) -> Result<usize, crate::shm::vnic::VnicError> {
        let mut n = 0;
        for k in 0..self.vnic.lanes() {
            if let Some(lane) = self.vnic.lane_mut(k) {
                n += serve_lane_frames(&mut self.sw, lane, &self.vatc, &mut self.c, now)?;
            }
        }
        // Swapped with this thread's buffer under the lock, not taken: both keep their room.
        std::mem::swap(
            &mut self
                .vatc
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .requests,
            &mut self.translate,
        );
        for (vm, iova, len) in self.translate.drain(..) {
            self.vnic
                .send_vm(&VatcMsg::Translate { vm, iova, len }, &[])?;
        }
        Ok(n)
    }

    /// Records from the flow rings held here and the control socket, handed to the node in
    /// the order they came (a control message about a shard thread's connection to that
    /// thread); commands and VM records are the driver's own. Returns how many.
    fn on_records(&mut self, now: Instant) -> Result<usize, crate::shm::vnic::VnicError> {
        let records = &mut self.records;
        let mut flow_n = 0;
        for k in 0..self.vnic.lanes() {
            if let Some(lane) = self.vnic.lane_mut(k) {
                flow_n += lane.recv_flow(256, |rec| records.push(rec))?;
            }
        }
        let (commands, vatc, c) = (&mut self.commands, &self.vatc, &mut self.c);
        let ctl_n = self.vnic.recv_control_paced(now.0, |rec| match rec {
            Control::Msg(m, s) => records.push(FlowRecord::Msg(m, s)),
            Control::Json(CONTROL_COMMAND, doc) => commands.push(doc),
            Control::Json(..) => {}
            Control::Vm(msg, fds) => vatc
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .on_control(msg, fds, c),
        })?;
        for rec in self.records.drain(..) {
            match rec {
                FlowRecord::Msg(m, s) => match self.threads.as_mut() {
                    Some(t) => match self.sw.plane().thread_of_msg(&m) {
                        0 => self.sw.handle_msg(now, m, s),
                        k => t.hand_to_shard(k, m, s),
                    },
                    None => self.sw.handle_msg(now, m, s),
                },
                FlowRecord::Ct(s) => self.sw.handle_conntrack(now, &s),
            }
        }
        for doc in self.commands.drain(..) {
            apply_command(&doc, &mut self.sw, self.threads.as_mut());
        }
        Ok(flow_n + ctl_n)
    }

    /// What the shard threads handed this one: their messages for the control socket, a
    /// lane that broke (the plane stops: the DPU fails open). Returns how many.
    fn on_threads(&mut self) -> Result<usize, String> {
        let Some(t) = self.threads.as_mut() else {
            return Ok(0);
        };
        let mut n = 0;
        while let Some(m) = t.recv() {
            n += 1;
            match m {
                ToMain::Out(o) => self.vnic.send_outgoing(&o).map_err(|e| e.to_string())?,
                ToMain::LaneFailed(why) => return Err(why),
            }
        }
        Ok(n)
    }

    /// The node's messages to the DPU (snapshots attached), each on the lane of its shard,
    /// then the doorbells.
    fn send_outgoing(&mut self, now: Instant) -> Result<(), crate::shm::vnic::VnicError> {
        let lanes = self.vnic.lanes();
        while let Some(o) = self.sw.poll_transmit(now) {
            let lane = self.sw.lane_of(&o, self.buckets, lanes);
            self.vnic.send_outgoing_on(lane, &o)?;
        }
        for k in 0..lanes {
            if let Some(l) = self.vnic.lane_mut(k) {
                l.kick();
            }
        }
        Ok(())
    }

    /// Sleeps in `poll` on the doorbells of the lanes held here, the shard threads' bell and
    /// the control socket until the model's next timer (at most 10 ms), unless something
    /// arrived while they were armed.
    fn sleep(&mut self, now: Instant) -> Result<(), String> {
        let lanes = self.vnic.lanes();
        let mut armed = self
            .threads
            .as_mut()
            .is_none_or(PlaneThreads::prepare_sleep);
        for k in 0..lanes {
            if let Some(l) = self.vnic.lane_mut(k) {
                armed &= l.prepare_sleep();
            }
        }
        if armed {
            let next = self
                .sw
                .poll_timeout()
                .map_or(10_000_000, |t| t.0.saturating_sub(now.0));
            let ms = (next / 1_000_000).min(10) as i32;
            let readable = |fd: std::os::fd::BorrowedFd<'_>| libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
                events: libc::POLLIN,
                revents: 0,
            };
            self.poll_set.clear();
            for k in 0..lanes {
                if let Some(l) = self.vnic.lane_mut(k) {
                    self.poll_set.push(readable(l.bell_fd()));
                }
            }
            if let Some(t) = &self.threads {
                self.poll_set.push(readable(t.main_bell.fd()));
            }
            let [_, control] = self.vnic.poll_fds();
            self.poll_set.push(readable(control));
            // SAFETY: `poll_set` holds `len` initialised `pollfd`s of fds this process holds
            // (the doorbells of its lanes, the threads' bell, its control socket), none closed
            // during the call; `poll` writes only `revents`. Every source is read again after
            // waking.
            let r = unsafe {
                libc::poll(
                    self.poll_set.as_mut_ptr(),
                    self.poll_set.len() as libc::nfds_t,
                    ms,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e.to_string());
                }
            }
            self.vnic.polled(&self.poll_set);
        }
        for k in 0..lanes {
            if let Some(l) = self.vnic.lane_mut(k) {
                l.woke();
            }
        }
        if let Some(t) = &self.threads {
            t.main_bell.woke();
        }
        Ok(())
    }

    /// The plane's counters and state to the DPU process, for its metrics and `ctl status`:
    /// this thread's and every shard thread's, summed.
    fn send_stats(&mut self) -> Result<(), crate::shm::vnic::VnicError> {
        let (sw, plane) = (&self.sw, self.sw.plane());
        let pipeline = sw.pipeline();
        let mut t = self
            .threads
            .as_ref()
            .map(PlaneThreads::stats)
            .unwrap_or_default();
        t.spill.add(&plane.counters());
        let drops = t.drops.merged(&plane.drops());
        t.frame.add(sw.counters());
        t.conns.add(sw.conns().counters());
        t.icmp.add(pipeline.icmp_error_counters());
        t.frag.add(&pipeline.frag_counters());
        t.vswitch_drops.merge(pipeline.drops());
        t.driver.add(&self.c);
        let mut counters = serde_json::Map::new();
        let mut put = |k: String, v: u64| {
            counters.insert(k, json!(v));
        };
        for (k, v) in t.spill.iter() {
            put(k.to_string(), v);
        }
        for (k, v) in drops.iter() {
            put(format!("plane.{k}"), v);
        }
        let vatc = self
            .vatc
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (k, v) in vatc.atc.counters().iter() {
            put(k.to_string(), v);
        }
        // The plane's own pipelines: their routers' ICMP errors and fragment tracking.
        for (k, v) in t
            .icmp
            .iter()
            .chain(t.frag.iter())
            .chain(t.frame.iter(&t.conns))
        {
            put(format!("plane.{k}"), v);
        }
        for (k, v) in t.driver.iter() {
            put(k.to_string(), v);
        }
        let dropped = self.threads.as_ref().map_or(0, |t| t.dropped);
        // Per shard: this thread's, then the shard threads'.
        let mut per_shard =
            vec![json!({"frames_in": self.c.frames_in, "conns": plane.conns_len()})];
        if let Some(th) = &self.threads {
            per_shard.extend(th.per_thread());
        }
        put("plane.threads.inbox_full".to_string(), dropped);
        let doc = json!({
            "pid": std::process::id(),
            "workers": plane.workers(),
            "threads": self.vnic.lanes(),
            "shards": per_shard,
            "conns": plane.conns_len() as u64 + t.conns_held,
            "placement": plane.policy_name(),
            "epoch": pipeline.epoch().0,
            "vatc": plane.vatc(),
            "vatc_vms": vatc.vms.len(),
            "atc_entries": vatc.atc.len(),
            "counters": counters,
            "forwarding_allocs": self.allocs.forwarding() + t.forwarding_allocs,
            "vswitch_drops": t.vswitch_drops.iter().filter(|(_, v)| *v > 0).collect::<std::collections::BTreeMap<_, _>>(),
        });
        drop(vatc);
        self.vnic.send_json(CONTROL_STATS, &doc)
    }
}

/// Set-up is done (rings mapped, pipeline and model built, clock read): from here on the plane
/// works only on descriptors it holds, so it gives up root, every capability and every system
/// call it does not use ([`crate::host::privilege`]). A plane that cannot do so does not run.
pub(crate) fn drop_privileges(tb: &Testbed) -> Result<(), String> {
    let p = tb.spill_privileges;
    crate::host::privilege::drop_privileges(&p).map_err(|e| e.to_string())?;
    tracing::info!(
        target: "spillway::plane",
        uid = p.uid,
        gid = p.gid,
        seccomp = p.seccomp.name(),
        "privileges dropped"
    );
    Ok(())
}

fn apply_command<R: PlaneResourcesHandle>(
    doc: &serde_json::Value,
    sw: &mut PlaneSwitch<SpillPlane<R>>,
    threads: Option<&mut PlaneThreads>,
) {
    if let Some(on) = doc.get("vatc").and_then(|v| v.as_bool()) {
        sw.plane_mut().set_vatc(on);
        tracing::info!(target: "spillway::plane", vatc = on, "delivery path of VM-bound packets switched");
    }
    if let Some(name) = doc.get("set_placement").and_then(|v| v.as_str())
        && let Some((_, kind)) = PlacementKind::NAMES.iter().find(|(n, _)| *n == name)
    {
        sw.plane_mut().set_placement(*kind);
        tracing::info!(target: "spillway::plane", placement = name, "placement policy changed");
    }
    if let Some(text) = doc.get("set_policy").and_then(|v| v.as_str()) {
        match Policy::from_toml_str(text, "policy from the DPU process") {
            Ok(p) => {
                if let Some(t) = threads {
                    t.set_policy(&p);
                }
                sw.set_policy(p);
                tracing::info!(target: "spillway::plane", epoch = sw.pipeline().epoch().0, "policy replaced");
            }
            Err(e) => tracing::error!(target: "spillway::plane", error = %e, "policy refused"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::virtq::{DESC_F_WRITE, DriverQueue, QUEUE_RX_PLANE, VmLayout, VmMemory};
    use spillway_fabric::atc::{AtcConfig, RegionTable};

    /// The DPU process's answer to a translation request (as `dpu::daemon` builds it).
    fn answer(table: &RegionTable, vm: VmId, iova: Iova, len: u64) -> VatcMsg {
        VatcMsg::Regions {
            vm,
            epoch: table.epoch(vm),
            iova,
            len,
            regions: table.regions(vm).copied().collect(),
        }
    }

    #[test]
    fn a_receive_buffer_outside_every_region_costs_one_translation_request_not_one_per_packet() {
        let layout = VmLayout {
            queue_size: 8,
            buf_bytes: 2048,
            iova_base: 1 << 36,
        };
        let mem = VmMemory::create("t", layout).unwrap();
        let vm = VmId(4);
        let mut table = RegionTable::new();
        for m in crate::dpu::vmport::regions(&layout) {
            table.map(vm, m).unwrap();
        }
        let mut v = Vatc {
            vms: BTreeMap::new(),
            atc: Atc::new(AtcConfig::default()).unwrap(),
            pending: BTreeSet::new(),
            requests: Vec::new(),
        };
        let mut c = PlaneCounters::default();
        let irq = crate::shm::ring::Doorbell::new().unwrap();
        let fds = vec![
            rustix::io::dup(mem.fd()).unwrap(),
            rustix::io::dup(irq.as_fd()).unwrap(),
        ];
        v.on_control(
            VatcMsg::Attach {
                vm,
                port: vm.0,
                epoch: table.epoch(vm),
            },
            fds,
            &mut c,
        );
        let mut requests = 0;
        let mut serve = |v: &mut Vatc, c: &mut PlaneCounters| {
            for (vm, iova, len) in std::mem::take(&mut v.requests) {
                requests += 1;
                v.on_control(answer(&table, vm, iova, len), Vec::new(), c);
            }
        };
        serve(&mut v, &mut c);
        // The VM keeps one receive buffer posted at an address outside every region.
        let mut rx = DriverQueue::new(&mem, QUEUE_RX_PLANE);
        let frame = [0u8; 100];
        for _ in 0..1000 {
            while let Ok(Some((id, _))) = rx.reclaim(&mem) {
                rx.put_free(id);
            }
            if let Some(id) = rx.take_free() {
                rx.post(&mem, id, 2048);
                let d = layout.desc_off(QUEUE_RX_PLANE) + 16 * usize::from(id);
                assert!(mem.write_bytes(d, &0x1000u64.to_le_bytes()));
                assert!(mem.write_bytes(d + 12, &DESC_F_WRITE.to_le_bytes()));
            }
            assert!(!v.deliver(PortId(vm.0), &[0; 12], &frame, &mut c));
            serve(&mut v, &mut c);
        }
        assert!(
            requests <= 2,
            "{requests} translation requests for 1,000 packets (the attach's and one for the gap)"
        );
        assert!(c.vatc_bad_desc >= 998, "{c:?}");
    }
}
