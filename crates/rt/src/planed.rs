//! The spill-plane process (`spillway spill-plane`), started by the DPU process in its own
//! cgroup: the host-side [`SpillPlane`] with the same vSwitch [`Pipeline`] as the DPU, on the
//! plane's end of the vNIC set.
//!
//! Per loop turn: frames steered to it from the phy ring (each offered to the model, then, if
//! the model serves it, run through the pipeline and sent back on the phy ring with the port it
//! leaves by; a frame of a connection it has no state for is punted back whole); records from
//! the flow ring and the control socket (conntrack snapshots adopted, so a connection it takes
//! over continues mid-stream); the model's timers and outputs (its messages carry the
//! connection's snapshot); every 500 ms its counters to the DPU process. It sleeps in `poll` on
//! its doorbell and the control socket. It exits on SIGTERM, or when the DPU process closes the
//! control socket.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use serde_json::json;
use spillway_fabric::dpu::Role;
use spillway_fabric::params::PlacementKind;
use spillway_fabric::spill::SpillPlane;
use spillway_fabric::types::{Channel, ConnId, Msg, Transmit};
use spillway_vswitch::packet::HEADROOM;
use spillway_vswitch::pipeline::{Pipeline, PipelineConfig};
use spillway_vswitch::policy::Policy;
use spillway_vswitch::{Instant, PacketBuf, PortId, Verdict};

use crate::clock::Clock;
use crate::flows::Flows;
use crate::signals;
use crate::testbed::Testbed;
use crate::vmport::{DirectRefused, PlaneVm};
use crate::vnic::{CONTROL_COMMAND, CONTROL_STATS, Control, FlowRecord, VnicSet};
use spillway_fabric::atc::{Atc, AtcConfig, AtcEpoch, HostAddr, Iova, Mapping, Perm, VmId};
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
}

/// Plane-process counters (`plane.*`, sent to the DPU process for its metrics).
#[derive(Clone, Copy, Debug, Default)]
struct PlaneCounters {
    frames_in: u64,
    frames_out: u64,
    punted: u64,
    drop_vswitch: u64,
    drop_model: u64,
    drop_ring_full: u64,
    adopted: u64,
    adopt_refused: u64,
    vatc_delivered: u64,
    vatc_miss: u64,
    vatc_no_buffer: u64,
    vatc_bad_desc: u64,
    vatc_no_port: u64,
    vatc_broken: u64,
    vatc_invalidations: u64,
}

/// The plane's side of the vATC: the VMs whose memory it holds (by the port they are), the
/// translation cache, and the VMs with a translation request outstanding.
struct Vatc {
    vms: BTreeMap<PortId, PlaneVm>,
    atc: Atc,
    pending: BTreeSet<u32>,
    requests: Vec<(VmId, Iova, u64)>,
}

impl Vatc {
    /// Delivers a processed frame into VM `out`'s memory; false if the caller must send it the
    /// DPU way (counted by reason; a miss queues a translation request).
    fn deliver(
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
            Ok(()) => {
                c.vatc_delivered += 1;
                true
            }
            Err(DirectRefused::Miss(m)) => {
                c.vatc_miss += 1;
                if self.pending.insert(vm.vm.0) {
                    for r in m.missing() {
                        self.requests.push((vm.vm, r.start, r.len));
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
                let vm = vm.vm;
                tracing::warn!(target: "spillway::plane", vm = vm.0, "VM receive queue broken; dropping its memory");
                self.vms.remove(&out);
                self.atc.invalidate_vm(vm);
                false
            }
        }
    }

    /// A [`crate::vnic::CONTROL_VM`] record from the DPU process.
    fn on_control(
        &mut self,
        doc: &serde_json::Value,
        fds: Vec<std::os::fd::OwnedFd>,
        c: &mut PlaneCounters,
    ) {
        let vm = doc["vm"]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .map(VmId);
        let epoch = doc["epoch"].as_u64().map(AtcEpoch);
        let (Some(vm), Some(epoch)) = (vm, epoch) else {
            tracing::warn!(target: "spillway::plane", %doc, "VM record without vm/epoch; ignored");
            return;
        };
        let port = PortId(vm.0);
        match doc["op"].as_str() {
            Some("attach") => {
                let mut fds = fds.into_iter();
                let (Some(mem), Some(irq)) = (fds.next(), fds.next()) else {
                    tracing::warn!(target: "spillway::plane", vm = vm.0, "attach without its fds; ignored");
                    return;
                };
                let mem = match crate::virtq::VmMemory::from_fd(mem) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(target: "spillway::plane", vm = vm.0, error = %e, "VM memory refused");
                        return;
                    }
                };
                let Ok(irq) = crate::ring::Doorbell::from_fd(irq) else {
                    return;
                };
                // New memory: whatever was cached for the VM is dead. Ask for the translation
                // of its receive queue 2 now, before the first packet needs it, so that packet
                // does not have to go the DPU way for want of it.
                self.atc.invalidate_vm(vm);
                let l = *mem.layout();
                let queue2 = crate::virtq::QUEUE_RX_PLANE;
                self.pending.insert(vm.0);
                self.requests
                    .push((vm, Iova(l.iova(l.bufs_off(queue2))), l.bufs_len() as u64));
                self.vms.insert(port, PlaneVm::new(vm, mem, irq, epoch));
                tracing::info!(target: "spillway::plane", vm = vm.0, epoch = epoch.0, "VM memory mapped");
            }
            Some("detach") => {
                c.vatc_invalidations += 1;
                self.vms.remove(&port);
                self.atc.invalidate_vm(vm);
                self.pending.remove(&vm.0);
                tracing::info!(target: "spillway::plane", vm = vm.0, epoch = epoch.0, "VM memory invalidated");
            }
            Some("regions") => {
                self.pending.remove(&vm.0);
                let Some(v) = self.vms.get_mut(&port) else {
                    return;
                };
                if epoch < v.epoch {
                    return; // an answer from before the VM's last change
                }
                v.epoch = epoch;
                let regions: Vec<Mapping> = doc["regions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| {
                        Some(Mapping {
                            iova: Iova(r[0].as_u64()?),
                            len: r[1].as_u64()?,
                            host: HostAddr(r[2].as_u64()?),
                            perm: Perm {
                                read: r[3].as_bool()?,
                                write: r[4].as_bool()?,
                            },
                        })
                    })
                    .collect();
                let (Some(iova), Some(len)) = (doc["iova"].as_u64(), doc["len"].as_u64()) else {
                    return;
                };
                // The answer lists all the VM's regions: what it leaves out of the asked range
                // is known unmapped at this epoch (a negative entry), so a buffer posted there
                // is refused from now on instead of asked about with every packet.
                if let Err(e) = self
                    .atc
                    .fill_map(vm, epoch, regions.iter(), Iova(iova), len)
                {
                    tracing::warn!(target: "spillway::plane", vm = vm.0, error = %e, "translation refused");
                }
            }
            other => {
                tracing::warn!(target: "spillway::plane", op = ?other, "unknown VM record; ignored");
            }
        }
    }
}

/// A frame the model served, as the vSwitch needs it.
struct Served<'a> {
    frame: &'a [u8],
    /// Its virtio-net header (GSO and checksum offload).
    vnet: [u8; 12],
    ingress: PortId,
    key: Option<spillway_wire::FlowKey>,
    tenant: spillway_vswitch::TenantId,
    /// The plane owns the connection: a TCP state change goes to the DPU's copy.
    watch: bool,
}

/// Runs the vSwitch on a frame the model served: loads it, watches the TCP state of a
/// connection the plane owns, and returns the egress port (None: dropped, counted).
fn process_frame(
    pipeline: &mut Pipeline,
    pkt: &mut PacketBuf,
    f: &Served<'_>,
    now: Instant,
    ct_out: &mut Vec<spillway_vswitch::conntrack::CtSnapshot>,
    c: &mut PlaneCounters,
) -> Option<PortId> {
    let Served {
        frame,
        vnet,
        ingress,
        key,
        tenant,
        watch,
    } = *f;
    if pkt.load(frame).is_err() {
        c.drop_vswitch += 1;
        return None;
    }
    if let Ok(h) = crate::vnet::VnetHdr::parse(&vnet) {
        pkt.set_gso_size(h.gso_segment());
    }
    let watch = watch && key.is_some_and(|k| k.proto == spillway_wire::ip_proto::TCP);
    let before = match (watch, key) {
        (true, Some(k)) => pipeline.export_conn(now, tenant, &k).map(|s| s.state),
        _ => None,
    };
    let verdict = pipeline.process(now, ingress, pkt);
    if watch
        && let Some(k) = key
        && let Some(after) = pipeline.export_conn(now, tenant, &k)
        && Some(after.state) != before
    {
        ct_out.push(after);
    }
    match verdict {
        Verdict::Forward(out) => Some(out),
        Verdict::Drop(_) => {
            c.drop_vswitch += 1;
            None
        }
    }
}

/// Runs the plane until SIGTERM or the DPU process goes away.
pub fn run(opts: PlaneOptions) -> Result<(), String> {
    let tb = Testbed::load(&opts.config).map_err(|e| e.to_string())?;
    // The handshake secret comes on stdin, a pipe from the DPU process that started us.
    let mut secret = [0u8; crate::vnic::SECRET_LEN];
    std::io::Read::read_exact(&mut std::io::stdin().lock(), &mut secret).map_err(|e| {
        format!(
            "reading the vNIC handshake secret from stdin: {e} (the spill plane is started by \
             `spillway run`, which hands it the secret)"
        )
    })?;
    let stream = UnixStream::connect(&opts.vnic_socket)
        .map_err(|e| format!("connecting to {}: {e}", opts.vnic_socket.display()))?;
    // Hand the secret only to the DPU process that started us, not to whoever listens there.
    let server = crate::unixsock::peer_cred(&stream)
        .map_err(|e| format!("credentials of {}: {e}", opts.vnic_socket.display()))?;
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
    if server.pid != parent {
        return Err(format!(
            "{} is served by pid {} (uid {}), not by our parent {parent}; not handing it the secret",
            opts.vnic_socket.display(),
            server.pid,
            server.uid
        ));
    }
    crate::vnic::send_auth(&stream, &secret).map_err(|e| e.to_string())?;
    let (mut vnic, hello) = VnicSet::accept(stream).map_err(|e| e.to_string())?;
    tracing::info!(target: "spillway::plane", pid = std::process::id(), hello = %hello, "vNIC set mapped");
    let clock = Clock::with_origin(opts.clock_origin_ns);
    let mut plane = SpillPlane::new(&tb.fabric);
    let mut pipeline = Pipeline::new(tb.policy.clone(), PipelineConfig::default())
        .map_err(|e| format!("pipeline: {e}"))?;
    let mut flows = Flows::new(1 << 20);
    let mut pkt = PacketBuf::with_capacity(HEADROOM + 12 + 18 + 65_535);
    let mut c = PlaneCounters::default();
    plane.start(clock.now(), opts.workers.max(1));
    let mut last_stats = Instant::ZERO;
    let mut inbox: Vec<(Msg, Option<spillway_vswitch::conntrack::CtSnapshot>)> = Vec::new();
    let mut commands: Vec<serde_json::Value> = Vec::new();
    let mut deferred: Vec<Msg> = Vec::with_capacity(64);
    let mut ct_out: Vec<spillway_vswitch::conntrack::CtSnapshot> = Vec::with_capacity(64);
    let mut ct_in: Vec<spillway_vswitch::conntrack::CtSnapshot> = Vec::with_capacity(64);
    let mut vatc = Vatc {
        vms: BTreeMap::new(),
        atc: Atc::new(AtcConfig::default()).expect("the default config is valid"),
        pending: BTreeSet::new(),
        requests: Vec::with_capacity(16),
    };
    drop_privileges(&tb)?;
    loop {
        if signals::stop_requested() {
            tracing::info!(target: "spillway::plane", "stopping on signal");
            return Ok(());
        }
        let now = clock.now();
        send_outputs(&mut plane, &mut vnic, &pipeline, &flows, now, None, &mut c)
            .map_err(|e| e.to_string())?;
        // Frames from the DPU: served by the model, processed by the pipeline, and sent back
        // from the receive ring straight onto the send ring.
        deferred.clear();
        let r = {
            let (plane, pipeline, flows, pkt, c, deferred, ct_out, vatc) = (
                &mut plane,
                &mut pipeline,
                &mut flows,
                &mut pkt,
                &mut c,
                &mut deferred,
                &mut ct_out,
                &mut vatc,
            );
            vnic.recv_frames_tx(256, |rec, tx| {
                c.frames_in += 1;
                let Some(t) = rec.msg.train().copied() else {
                    return;
                };
                // As the pipeline parses it: VXLAN only on the uplink, for our VTEP.
                let decap = pipeline.policy().host().decap_at(PortId(rec.port));
                let key = spillway_wire::parse_frame_decap(rec.frame, decap)
                    .ok()
                    .and_then(|p| p.outer.key);
                if t.kind == spillway_fabric::types::Kind::Open
                    && let Some(key) = key
                {
                    flows.learn(now, t.tenant, key);
                }
                plane.handle_msg(now, Msg::Packets(t));
                let plane_owns = plane.conn(t.conn).is_some_and(|c| c.role == Role::Owner);
                let vnet: [u8; 12] = *rec.vnet;
                let mut served = false;
                // The egress port of a frame the vATC path refused: the pipeline has run.
                let mut refused_out = None;
                let direct = plane.direct_last();
                let this = Served {
                    frame: rec.frame,
                    vnet,
                    ingress: PortId(rec.port),
                    key,
                    tenant: t.tenant,
                    watch: plane_owns,
                };
                if direct > 0 {
                    // The model sent it the vATC way: process, then copy into the VM's memory.
                    served = true;
                    let out = process_frame(pipeline, pkt, &this, now, ct_out, c);
                    if let Some(out) = out
                        && !vatc.deliver(out, crate::vnet::header_after(pkt, &vnet), pkt.data(), c)
                    {
                        let mut back = t;
                        back.packets = direct;
                        plane.handle_direct_refused(now, &back);
                        refused_out = Some(out);
                    }
                }
                while let Some(Transmit { channel, msg, .. }) = plane.poll_transmit() {
                    match (channel, &msg) {
                        (Channel::PhyVnic, Msg::Packets(done)) if done.conn == t.conn => {
                            served = true;
                            let out = match refused_out.take() {
                                Some(out) => Some(out),
                                None => process_frame(pipeline, pkt, &this, now, ct_out, c),
                            };
                            if let Some(out) = out {
                                if tx.send_frame(
                                    &msg,
                                    out.0,
                                    crate::vnet::header_after(pkt, &vnet),
                                    pkt.data(),
                                ) {
                                    c.frames_out += 1;
                                } else {
                                    c.drop_ring_full += 1;
                                }
                            }
                        }
                        (Channel::PhyVnic, Msg::Punt(back)) if back.conn == t.conn => {
                            served = true;
                            c.punted += 1;
                            if !tx.send_frame(&msg, rec.port, &vnet, rec.frame) {
                                c.drop_ring_full += 1;
                            }
                        }
                        _ => deferred.push(msg),
                    }
                }
                if !served {
                    c.drop_model += 1;
                }
                if t.kind == spillway_fabric::types::Kind::Close {
                    flows.forget(t.conn);
                }
            })
        };
        for vm in vatc.vms.values_mut() {
            vm.flush_irq();
        }
        for (vm, iova, len) in vatc.requests.drain(..) {
            vnic.send_vm(
                &json!({"op": "translate", "vm": vm.0, "iova": iova.0, "len": len}),
                &[],
            )
            .map_err(|e| e.to_string())?;
        }
        for msg in deferred.drain(..) {
            let snap = snapshot_for(&msg, &pipeline, &flows, now);
            vnic.send_msg(channel_is_control(&msg), &msg, snap.as_ref())
                .map_err(|e| e.to_string())?;
        }
        // After the model's own messages, so a copy the DPU creates from a mirror exists.
        for s in ct_out.drain(..) {
            vnic.send_ct(&s);
        }
        let out_frames = 0usize;
        let busy_frames = r.map_err(|e| e.to_string())? > 0;
        // Flow ring and control.
        inbox.clear();
        ct_in.clear();
        let flow_n = vnic
            .recv_flow(256, |rec| match rec {
                FlowRecord::Msg(m, s) => inbox.push((m, s)),
                FlowRecord::Ct(s) => ct_in.push(s),
            })
            .map_err(|e| e.to_string())?;
        for s in ct_in.drain(..) {
            // The DPU owns the connection; the plane keeps its copy current.
            if plane
                .conn(flows.id_of(s.zone, &s.orig))
                .is_some_and(|c| c.role == Role::Copy)
            {
                match pipeline.adopt_conn(now, &s) {
                    Ok(()) => c.adopted += 1,
                    Err(_) => c.adopt_refused += 1,
                }
            }
        }
        let ctl_n = match vnic.recv_control(|rec| match rec {
            Control::Msg(m, s) => inbox.push((m, s)),
            Control::Json(CONTROL_COMMAND, doc) => commands.push(doc),
            Control::Json(..) => {}
            Control::Vm(doc, fds) => vatc.on_control(&doc, fds, &mut c),
        }) {
            Ok(n) => n,
            Err(crate::vnic::VnicError::Closed) => {
                tracing::info!(target: "spillway::plane", "DPU process closed the control socket; exiting");
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        for (m, s) in inbox.drain(..) {
            if let Msg::Sync {
                kind: spillway_fabric::types::SyncKind::Closed,
                state,
                ..
            } = m
                && let Some(rec) = flows.forget(state.conn)
            {
                // The DPU carried the close: this pipeline's copy is stale.
                pipeline.forget_conn(now, rec.zone, &rec.orig);
            }
            plane.handle_msg(now, m);
            // As in the DPU process: only the owner's state, of a connection the model still
            // holds, is adopted.
            if let Some(s) = s
                && crate::dpud::carries_owner_state(&m)
                && plane.conn(flows.id_of(s.zone, &s.orig)).is_some()
            {
                flows.learn(now, s.zone, s.orig);
                match pipeline.adopt_conn(now, &s) {
                    Ok(()) => c.adopted += 1,
                    Err(_) => c.adopt_refused += 1,
                }
            }
        }
        for doc in commands.drain(..) {
            apply_command(&doc, &mut plane, &mut pipeline);
        }
        if plane.poll_timeout().is_some_and(|t| t <= now) {
            plane.handle_timeout(now);
        }
        send_outputs(&mut plane, &mut vnic, &pipeline, &flows, now, None, &mut c)
            .map_err(|e| e.to_string())?;
        vnic.kick();
        if now.0.saturating_sub(last_stats.0) >= 500_000_000 {
            last_stats = now;
            flows.expire(now, std::time::Duration::from_secs(120), 4096);
            let mut counters = serde_json::Map::new();
            for (k, v) in plane.counters().iter() {
                counters.insert(k.to_string(), json!(v));
            }
            for (k, v) in plane.drops().iter() {
                counters.insert(format!("plane.{k}"), json!(v));
            }
            for (k, v) in vatc.atc.counters().iter() {
                counters.insert(k.to_string(), json!(v));
            }
            // The plane's own pipeline: its router's ICMP errors and fragment tracking.
            for (k, v) in pipeline
                .icmp_error_counters()
                .iter()
                .chain(pipeline.frag_counters().iter())
            {
                counters.insert(format!("plane.{k}"), json!(v));
            }
            for (k, v) in [
                ("plane.frames.in", c.frames_in),
                ("plane.frames.out", c.frames_out),
                ("plane.frames.punted", c.punted),
                ("plane.drop.vswitch", c.drop_vswitch),
                ("plane.drop.model", c.drop_model),
                ("plane.drop.ring_full", c.drop_ring_full),
                ("plane.snapshot.adopted", c.adopted),
                ("plane.snapshot.refused", c.adopt_refused),
                ("plane.vatc.delivered", c.vatc_delivered),
                ("plane.vatc.miss", c.vatc_miss),
                ("plane.vatc.no_buffer", c.vatc_no_buffer),
                ("plane.vatc.bad_desc", c.vatc_bad_desc),
                ("plane.vatc.no_port", c.vatc_no_port),
                ("plane.vatc.broken", c.vatc_broken),
                ("plane.vatc.invalidations", c.vatc_invalidations),
            ] {
                counters.insert(k.to_string(), json!(v));
            }
            let doc = json!({
                "pid": std::process::id(),
                "workers": plane.workers(),
                "conns": plane.conns_len(),
                "placement": plane.policy_name(),
                "epoch": pipeline.epoch().0,
                "vatc": plane.vatc(),
                "vatc_vms": vatc.vms.len(),
                "atc_entries": vatc.atc.len(),
                "counters": counters,
                "vswitch_drops": pipeline.drops().iter().filter(|(_, v)| *v > 0).collect::<std::collections::BTreeMap<_, _>>(),
            });
            vnic.send_json(CONTROL_STATS, &doc)
                .map_err(|e| e.to_string())?;
        }
        if !busy_frames && flow_n == 0 && ctl_n == 0 && out_frames == 0 {
            sleep(&mut vnic, &plane, now)?;
        }
    }
}

/// Set-up is done (rings mapped, pipeline and model built, clock read): from here on the plane
/// works only on descriptors it holds, so it gives up root, every capability and every system
/// call it does not use ([`crate::privilege`]). A plane that cannot do so does not run.
fn drop_privileges(tb: &Testbed) -> Result<(), String> {
    let p = tb.spill_privileges;
    crate::privilege::drop_privileges(&p).map_err(|e| e.to_string())?;
    tracing::info!(
        target: "spillway::plane",
        uid = p.uid,
        gid = p.gid,
        seccomp = p.seccomp.name(),
        "privileges dropped"
    );
    Ok(())
}

fn channel_is_control(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::Delete { .. }
            | Msg::DeleteAck { .. }
            | Msg::Adopted { .. }
            | Msg::Activated { .. }
            | Msg::Release { .. }
            | Msg::Released { .. }
            | Msg::Drain { .. }
            | Msg::Drained { .. }
            | Msg::Absorbing
            | Msg::OffloadStats { .. }
            | Msg::Budget { .. }
            | Msg::Heartbeat { .. }
            | Msg::SetWorkers { .. }
    )
}

fn snapshot_for(
    msg: &Msg,
    pipeline: &Pipeline,
    flows: &Flows,
    now: Instant,
) -> Option<spillway_vswitch::conntrack::CtSnapshot> {
    let conn: ConnId = match msg {
        Msg::Sync { state, .. } | Msg::Recall { state, .. } => state.conn,
        _ => return None,
    };
    let rec = flows.get(conn)?;
    pipeline.export_conn(now, rec.zone, &rec.orig)
}

fn send_outputs(
    plane: &mut SpillPlane,
    vnic: &mut VnicSet,
    pipeline: &Pipeline,
    flows: &Flows,
    now: Instant,
    _ctx: Option<()>,
    c: &mut PlaneCounters,
) -> Result<(), crate::vnic::VnicError> {
    while let Some(Transmit { channel, msg, .. }) = plane.poll_transmit() {
        if msg.train().is_some() {
            // Phy messages are produced only while a frame is handled, which pairs them.
            c.drop_model += 1;
            continue;
        }
        let snap = snapshot_for(&msg, pipeline, flows, now);
        vnic.send_msg(channel == Channel::Control, &msg, snap.as_ref())?;
    }
    Ok(())
}

fn apply_command(doc: &serde_json::Value, plane: &mut SpillPlane, pipeline: &mut Pipeline) {
    if let Some(on) = doc.get("vatc").and_then(|v| v.as_bool()) {
        plane.set_vatc(on);
        tracing::info!(target: "spillway::plane", vatc = on, "delivery path of VM-bound packets switched");
    }
    if let Some(name) = doc.get("set_placement").and_then(|v| v.as_str())
        && let Some((_, kind)) = PlacementKind::NAMES.iter().find(|(n, _)| *n == name)
    {
        plane.set_placement(*kind);
        tracing::info!(target: "spillway::plane", placement = name, "placement policy changed");
    }
    if let Some(text) = doc.get("set_policy").and_then(|v| v.as_str()) {
        match Policy::from_toml_str(text, "policy from the DPU process") {
            Ok(p) => {
                pipeline.set_policy(p);
                tracing::info!(target: "spillway::plane", epoch = pipeline.epoch().0, "policy replaced");
            }
            Err(e) => tracing::error!(target: "spillway::plane", error = %e, "policy refused"),
        }
    }
}

fn sleep(vnic: &mut VnicSet, plane: &SpillPlane, now: Instant) -> Result<(), String> {
    if !vnic.prepare_sleep() {
        return Ok(());
    }
    let next = plane
        .poll_timeout()
        .map_or(10_000_000, |t| t.0.saturating_sub(now.0));
    let ms = (next / 1_000_000).min(10) as i64;
    {
        let fds = vnic.poll_fds();
        let mut pfds: Vec<rustix::event::PollFd<'_>> = fds
            .iter()
            .map(|fd| rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN))
            .collect();
        let ts = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: ms * 1_000_000,
        };
        match rustix::event::poll(&mut pfds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io::Error::from(e).to_string()),
        }
    }
    vnic.woke();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtq::{DESC_F_WRITE, DriverQueue, QUEUE_RX_PLANE, VmLayout, VmMemory};
    use spillway_fabric::atc::{AtcConfig, RegionTable};

    /// The DPU process's answer to a translation request (as `dpud` builds it).
    fn answer(table: &RegionTable, vm: VmId, iova: Iova, len: u64) -> serde_json::Value {
        let regions: Vec<serde_json::Value> = table
            .regions(vm)
            .map(|m| json!([m.iova.0, m.len, m.host.0, m.perm.read, m.perm.write]))
            .collect();
        json!({"op": "regions", "vm": vm.0, "epoch": table.epoch(vm).0,
               "iova": iova.0, "len": len, "regions": regions})
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
        for m in crate::vmport::regions(&layout) {
            table.map(vm, m).unwrap();
        }
        let mut v = Vatc {
            vms: BTreeMap::new(),
            atc: Atc::new(AtcConfig::default()).unwrap(),
            pending: BTreeSet::new(),
            requests: Vec::new(),
        };
        let mut c = PlaneCounters::default();
        let irq = crate::ring::Doorbell::new().unwrap();
        let fds = vec![
            rustix::io::dup(mem.fd()).unwrap(),
            rustix::io::dup(irq.as_fd()).unwrap(),
        ];
        v.on_control(
            &json!({"op": "attach", "vm": vm.0, "epoch": table.epoch(vm).0, "fds": 2}),
            fds,
            &mut c,
        );
        let mut requests = 0;
        let mut serve = |v: &mut Vatc, c: &mut PlaneCounters| {
            for (vm, iova, len) in std::mem::take(&mut v.requests) {
                requests += 1;
                v.on_control(&answer(&table, vm, iova, len), Vec::new(), c);
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
