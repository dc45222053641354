//! The daemon's methods that start, stop and watch the spill planes' processes ([`PlaneProc`]),
//! one per plane slot of the core (the active plane and, with warm standby or during an
//! upgrade, the warm one): accepting (and authenticating) each one's vNIC connection, telling
//! the core when one dies or breaks the protocol (it fails over or fails open), and telling the
//! planes of shared-memory port changes and operator commands. The daemon (`daemon.rs`) calls
//! these from its outputs (`after_input`) and its upkeep.

use crate::dpu::daemon::DpuDaemon;
use crate::dpu::forward::Parcel;
use crate::dpu::plane_proc::PlaneProc;
use crate::dpu::ports::{PortIo, RtCounters, VmChange, vm_id, worth_logging};
use crate::shm::codec::VatcMsg;
use crate::shm::vnic::{CONTROL_COMMAND, VnicSet};
use crate::vm::vhost_user::lend::LendSpec;
use serde_json::json;
use spillway_fabric::dpu::{EventKind, Upgrade};
use spillway_vswitch::PortId;

use crate::dpu::daemon::{PortsOut, gso_size, offer_frame};
use spillway_fabric::types::PlaneSlot;
use spillway_vswitch::Instant;
use std::path::Path;

/// Connections taken from the vNIC socket per loop turn.
const VNIC_ACCEPTS_PER_TURN: usize = 16;

/// Frames taken back from a failed plane's phy ring, at most.
const RECLAIM_FRAMES: usize = 4096;
/// Bytes of frames taken back from a failed plane's phy ring, at most.
const RECLAIM_BYTES: usize = 8 << 20;

/// A frame taken back from a failed plane's phy ring: as it came from `port`.
#[derive(Debug)]
pub(super) struct Reclaimed {
    port: PortId,
    vnet: crate::dpu::daemon::Vnet,
    frame: Vec<u8>,
}

/// Frames a failed plane never took (from its rings, or steered to its slot once it was gone:
/// see `Egress::keep`), waiting to be offered again: at most [`RECLAIM_FRAMES`] frames and
/// [`RECLAIM_BYTES`] bytes.
#[derive(Debug, Default)]
pub(super) struct KeptFrames {
    frames: Vec<Reclaimed>,
    bytes: usize,
}

impl KeptFrames {
    /// Keeps a frame (`rt.plane.reclaimed`), or drops and counts it past the bounds
    /// (`rt.plane.reclaim_dropped`). False if it was dropped.
    pub(super) fn keep(
        &mut self,
        counters: &mut RtCounters,
        port: PortId,
        vnet: &crate::dpu::daemon::Vnet,
        frame: &[u8],
    ) -> bool {
        if self.frames.len() >= RECLAIM_FRAMES || self.bytes + frame.len() > RECLAIM_BYTES {
            counters.plane_reclaim_dropped += 1;
            return false;
        }
        counters.plane_reclaimed += 1;
        self.bytes += frame.len();
        self.frames.push(Reclaimed {
            port,
            vnet: *vnet,
            frame: frame.to_vec(),
        });
        true
    }

    pub(super) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Every frame kept, oldest first; none are left.
    fn take(&mut self) -> Vec<Reclaimed> {
        self.bytes = 0;
        std::mem::take(&mut self.frames)
    }

    /// Puts frames taken but not offered yet back in front of any kept since, as they were
    /// (counted once, when first kept).
    fn put_back(&mut self, mut frames: Vec<Reclaimed>) {
        frames.append(&mut self.frames);
        self.bytes = frames.iter().map(|r| r.frame.len()).sum();
        self.frames = frames;
    }
}

/// The daemon's side of the plane's process.
impl DpuDaemon {
    /// Lanes of the plane's vNIC set: one per forwarding thread.
    pub(super) fn lanes(&self) -> usize {
        self.links.as_ref().map_or(1, |l| l.threads())
    }

    /// The slot the redirect rules steer to.
    pub(super) fn active_slot(&self) -> PlaneSlot {
        self.sw.dpu().active_slot()
    }

    /// The active plane's process, if one runs.
    pub(super) fn active_plane(&self) -> Option<&PlaneProc> {
        self.planes[self.active_slot().index()].as_ref()
    }

    /// Tells every forwarding thread to drop its lane of the plane in `slot`, which is
    /// going, or (`reclaim`: it was killed) to give it back to take its phy ring back from.
    fn close_lanes(&mut self, slot: PlaneSlot, reclaim: bool) {
        if let Some(l) = self.links.as_mut() {
            let me = l.me();
            for k in (0..l.threads()).filter(|&k| k != me) {
                l.send(k, Parcel::LaneClosed { slot, reclaim });
            }
        }
    }

    /// The slot of plane process number `plane`, if it is still in one.
    pub(super) fn slot_of_plane(&self, plane: u64) -> Option<PlaneSlot> {
        (0..2)
            .find(|&i| self.planes[i].as_ref().is_some_and(|p| p.number == plane))
            .map(|i| PlaneSlot(i as u8))
    }

    /// A forwarding thread's lane of killed plane `plane`, given back: kept with the process
    /// until it is reaped, or taken back from now if it is gone already.
    pub(super) fn lane_back(&mut self, mut lane: crate::shm::vnic::VnicLane, plane: u64) {
        match self.retiring.iter_mut().find(|r| r.number() == plane) {
            Some(r) => r.keep_lane(lane),
            None => self.reclaim(&mut lane),
        }
    }

    /// The plane in `slot` died or broke the protocol: it is killed, and the core decides
    /// (a warm plane takes over, or the DPU fails open; a failed warm plane is replaced).
    pub(super) fn plane_failed_in(&mut self, slot: PlaneSlot, now: Instant, why: &str) {
        if self.kill_plane(slot) {
            self.dp.counters.plane_failures += 1;
            tracing::warn!(target: "spillway::run", %slot, reason = why, "spill plane failed");
            self.sw.dpu_mut().handle_plane_failed_in(
                now,
                slot,
                &format!("spill plane failed: {why}"),
            );
        }
    }

    /// Kills the plane in `slot`; once it is reaped (now if it was dead already, else at an
    /// upkeep), what it never took from its phy ring is taken back and offered again once the
    /// core steers to a plane that runs (`reoffer`). Only once the process is gone can nothing
    /// it pops race with the taking back. False if the slot had no plane.
    /// Every failed plane ends here (it died, broke the protocol, or the core stopped it for
    /// missed heartbeats): a remote one's pool is reported to the cluster agent, which gives
    /// its cores back and avoids it for a while (the core has voided the grant itself).
    fn kill_plane(&mut self, slot: PlaneSlot) -> bool {
        let Some(p) = self.take_plane(slot, true) else {
            return false;
        };
        if p.remote
            && let Some(c) = &self.cluster
        {
            c.pool_failed();
        }
        self.retiring.push(p.kill_async());
        self.reap_retired();
        true
    }

    /// The plane in `slot`, out of its slot, with the forwarding threads' lanes of its vNIC
    /// set closed (`reclaim`: given back, see [`DpuDaemon::close_lanes`]).
    fn take_plane(&mut self, slot: PlaneSlot, reclaim: bool) -> Option<PlaneProc> {
        let p = self.planes[slot.index()].take()?;
        self.close_lanes(slot, reclaim);
        Some(p)
    }

    /// Takes back the frames a dead plane never took from a lane's phy ring (lane 0's, in its
    /// vNIC set; a forwarding thread's, given back): at most [`RECLAIM_FRAMES`] frames and
    /// [`RECLAIM_BYTES`] bytes are kept in all; the rest are dropped and counted.
    fn reclaim(&mut self, v: &mut crate::shm::vnic::VnicLane) {
        let (kept, counters) = (&mut self.reclaimed, &mut self.dp.counters);
        let room = RECLAIM_FRAMES.saturating_sub(kept.frames.len());
        let r = v.reclaim_frames(room, |rec| {
            kept.keep(counters, PortId(rec.port), rec.vnet, rec.frame);
        });
        if let Err(e) = r {
            tracing::warn!(target: "spillway::run", error = %e, "could not take back what the failed plane left in its ring");
        }
    }

    /// Offers the frames taken back from a failed plane again, as they first came from their
    /// ports, once the core steers to a plane that runs or serves them itself: not while a
    /// flip to the warm plane is under way (they would be steered to the dead one).
    pub(super) fn reoffer(&mut self, now: Instant) {
        if !self.sw.dpu().takes_reoffers() {
            return;
        }
        // The forwarding threads see the lifecycle that made the re-offers possible (a
        // fail-open's, which no longer steers) before the frames reach them: a thread takes a
        // newer view before a re-offered frame (`Forwarder::poll_inbox`).
        if let Some(l) = self.links.as_mut() {
            l.publish_view(self.sw.dpu().view());
        }
        let mut frames = self.reclaimed.take().into_iter();
        while let Some(r) = frames.next() {
            if self.rx.load(&r.frame).is_err() {
                continue;
            }
            self.rx.set_gso_size(gso_size(&r.vnet));
            let a = self.active_slot().index();
            let mut out = PortsOut {
                dp: &mut self.dp,
                plane: self.planes[a].as_mut(),
                tx: self.taps.as_mut().map(|t| t.tx()),
                links: self.links.as_mut(),
                kept: None,
                reoffer: true,
                refused: false,
            };
            offer_frame(&mut self.sw, &mut out, now, r.port, &r.vnet, &mut self.rx);
            if out.refused {
                // Its thread's buffers (or queue) are full with what went before: it and the
                // rest wait for a later turn, in order, while that thread catches up.
                self.reclaimed
                    .put_back(std::iter::once(r).chain(frames).collect());
                break;
            }
        }
        self.after_input(now);
    }

    /// Starts a plane in `slot` with `workers` workers (the binary of the last `ctl upgrade`,
    /// or this one).
    pub(super) fn start_plane(
        &mut self,
        now: Instant,
        slot: PlaneSlot,
        workers: u32,
        remote: bool,
    ) {
        if self.planes[slot.index()].is_some() {
            self.stop_plane(slot, false);
        }
        let launch = crate::plane::process::launch(
            &self.plane_exe,
            &self.tb.file,
            &self.vnic_path,
            workers,
            self.clock.origin_ns(),
        );
        let crate::plane::process::Launch {
            mut cmd,
            secret,
            secret_w,
        } = match launch {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(target: "spillway::run", error = %e, "could not make the plane's handshake secret");
                self.sw.dpu_mut().handle_plane_failed_in(
                    now,
                    slot,
                    &format!("handshake secret: {e}"),
                );
                return;
            }
        };
        // A remote plane: this process's child is the relay to the pool host's service, which
        // gets the reservation's token after the secret.
        let mut token = String::new();
        if remote {
            let grant = self.cluster.as_ref().and_then(|c| {
                let g = c.remote_grant()?;
                Some((
                    g.endpoint?,
                    g.token,
                    c.spec().host.clone(),
                    c.spec().netns.clone(),
                ))
            });
            let Some((endpoint, t, host, netns)) = grant else {
                // The reservation went between the core's last report and now: a failed
                // remote plane to the core, which voids the grant.
                self.sw.dpu_mut().handle_plane_failed_in(
                    now,
                    slot,
                    "a remote plane, but no reservation on a pool host that serves one",
                );
                return;
            };
            cmd.arg("--remote").arg(endpoint.to_string());
            cmd.arg("--remote-host").arg(host);
            if let Some(ns) = netns {
                cmd.arg("--remote-netns").arg(ns);
            }
            token = t;
        }
        let spawned = match self.ledger.as_mut() {
            Some(l) => l.spawn(&mut cmd).map_err(|e| e.to_string()),
            None => cmd.spawn().map_err(|e| e.to_string()),
        };
        // Drop our copy of the read end (held by `cmd`): the child holds the only one.
        drop(cmd);
        match spawned {
            Ok(child) => {
                let pid = child.id();
                // Into its cgroup, then its secret, on a thread of their own: a v1 cpuset move
                // takes milliseconds the loop would not forward for (a failover starts the new
                // warm plane right after the flip). The plane reads its secret before it does
                // anything but parse the testbed, so it runs in its cgroup from then on. A
                // plane whose secret could not be written never connects, exits, and is seen
                // to fail.
                let joiner = self.cgroup.as_ref().map(|c| c.joiner());
                let handed = std::thread::Builder::new()
                    .name("plane-start".into())
                    .spawn(move || {
                        if let Some(j) = joiner
                            && let Err(e) = j.add_pid(pid)
                        {
                            tracing::warn!(target: "spillway::run", pid, error = %e, "could not move the spill plane into its cgroup");
                        }
                        let handed = crate::plane::process::hand_secret(
                            secret_w,
                            &secret,
                            token.as_bytes(),
                        );
                        if let Err(e) = handed {
                            tracing::error!(target: "spillway::run", pid, error = %e, "could not hand the spill plane its secret");
                        }
                    });
                if let Err(e) = handed {
                    tracing::error!(target: "spillway::run", pid, error = %e, "could not start a thread to hand the plane its secret");
                }
                self.dp.counters.plane_starts += 1;
                let number = self.dp.counters.plane_starts;
                tracing::info!(target: "spillway::run", pid, workers, %slot, remote, exe = %self.plane_exe.display(), at_ms = now.0 as f64 / 1e6, "spill plane started");
                self.planes[slot.index()] = Some(PlaneProc {
                    number,
                    child,
                    exe: self.plane_exe.clone(),
                    secret,
                    vnic: None,
                    up: false,
                    workers,
                    remote,
                    stats: serde_json::Value::Null,
                });
            }
            Err(e) => {
                tracing::error!(target: "spillway::run", error = %e, exe = %self.plane_exe.display(), "could not start the spill plane");
                self.sw.dpu_mut().handle_plane_failed_in(
                    now,
                    slot,
                    &format!("could not start the spill plane: {e}"),
                );
            }
        }
    }

    /// `spillway ctl upgrade [--binary PATH]`: the core's online upgrade
    /// ([`DpuNode::handle_upgrade`](spillway_fabric::dpu::DpuNode::handle_upgrade)), with the
    /// new plane running `binary` (checked: [`trusted_executable`]) if one is given. A warm
    /// plane already running another binary is replaced first (the core's
    /// `handle_upgrade_fresh`), so the upgrade's new plane runs the binary asked for. Refused
    /// whenever the core refuses (no active plane, an upgrade or a flip under way), saying
    /// why.
    pub(super) fn upgrade(
        &mut self,
        now: Instant,
        binary: Option<&str>,
    ) -> Result<serde_json::Value, String> {
        let exe = match binary {
            Some(b) => {
                crate::host::ledger::trusted_executable(Path::new(b)).map_err(|e| e.to_string())?
            }
            None => self.plane_exe.clone(),
        };
        // Recorded before any process runs it, so that the recovery after a crash knows the
        // plane processes running it as ours.
        if let Some(l) = self.ledger.as_mut() {
            let entry = crate::host::ledger::LedgerEntry::Exe(exe.clone());
            if !l.entries().contains(&entry) {
                l.record(entry).map_err(|e| e.to_string())?;
            }
        }
        // A warm plane of another binary cannot be the upgrade's: the core starts one.
        let warm = self.active_slot().other();
        let fresh = self.planes[warm.index()]
            .as_ref()
            .is_some_and(|p| p.exe != exe);
        let before = std::mem::replace(&mut self.plane_exe, exe);
        if fresh {
            self.sw.dpu_mut().handle_upgrade_fresh(now);
        } else {
            self.sw.dpu_mut().handle_upgrade(now);
        }
        if self.sw.dpu().upgrade() == Upgrade::None {
            self.plane_exe = before;
            self.after_input(now);
            return Err(self
                .events
                .back()
                .filter(|e| e.what == EventKind::Upgrade)
                .map_or_else(
                    || "the fabric refused the upgrade".into(),
                    |e| e.reason.clone(),
                ));
        }
        self.after_input(now);
        tracing::info!(target: "spillway::run", exe = %self.plane_exe.display(), "online upgrade under way");
        Ok(json!({
            "upgrade": self.sw.dpu().upgrade().name(),
            "warm": self.sw.dpu().warm().name(),
            "plane_exe": self.plane_exe.display().to_string(),
        }))
    }

    /// The core stops the plane in `slot` (see `Command::StopPlane`): one that `failed` (it
    /// missed its heartbeats: stopped or starved; a dead one is gone already) is killed at
    /// once and its ring taken back; one stopped in order is fenced at once (its vNIC set
    /// closed), then retired without the loop waiting for it ([`PlaneProc::retire`]).
    pub(super) fn stop_plane(&mut self, slot: PlaneSlot, failed: bool) {
        if failed {
            if self.kill_plane(slot) {
                tracing::warn!(target: "spillway::run", %slot, "unresponsive spill plane killed");
            }
            return;
        }
        if let Some(p) = self.take_plane(slot, false) {
            let r = p.retire();
            tracing::info!(target: "spillway::run", %slot, pid = r.pid(), "spill plane stopped");
            self.retiring.push(r);
        }
    }

    /// Stops every plane and waits for each (at teardown).
    pub(super) fn stop_planes(&mut self) {
        for slot in [PlaneSlot(0), PlaneSlot(1)] {
            self.close_lanes(slot, false);
        }
        for p in self.planes.iter_mut().filter_map(Option::take) {
            p.stop();
        }
        for r in self.retiring.drain(..) {
            r.kill();
        }
    }

    /// Reaps the retired planes that have exited (killing those past their grace), and takes
    /// back the rings of the killed ones that are gone.
    fn reap_retired(&mut self) {
        let mut rings = Vec::new();
        let mut gone_pids = Vec::new();
        self.retiring.retain_mut(|r| {
            let gone = r.reap();
            if gone {
                rings.extend(r.take_rings());
                gone_pids.push(r.pid());
            }
            !gone
        });
        // A plane that died inside a guest's receive queue holds it no more (the frame it was
        // writing was not published; the next holder takes that chain again). Only once the
        // process is gone can it write nothing more.
        for pid in gone_pids {
            for p in &self.dp.ports {
                if let PortIo::VhostUser(s) = &p.io {
                    s.dev().lease.clear_holder(pid);
                }
            }
        }
        for mut lane in rings {
            self.reclaim(&mut lane);
        }
    }

    /// Accepts the plane's connection; notices its death. Every pending connection is taken:
    /// one from another process (`SO_PEERCRED` pid other than the plane's) is closed at once
    /// and counted, so a flood of them neither delays the plane nor gets anything; the plane's
    /// own must then show the secret it was started with.
    pub(super) fn manage_plane(&mut self, now: Instant) {
        // A bounded number per turn, so that connections arriving as fast as they are refused
        // cannot keep the loop here.
        for _ in 0..VNIC_ACCEPTS_PER_TURN {
            let Ok((stream, _)) = self.listener.accept() else {
                break;
            };
            // The plane it must be: one we started that has not connected yet, by pid.
            let waiting = |p: &Option<PlaneProc>| {
                p.as_ref()
                    .filter(|p| p.vnic.is_none())
                    .map(|p| p.child.id())
            };
            let want: Vec<u32> = self.planes.iter().filter_map(waiting).collect();
            let peer = crate::host::unixsock::peer_cred(&stream);
            let slot = peer.as_ref().ok().and_then(|c| {
                (0..2)
                    .find(|&i| waiting(&self.planes[i]) == Some(c.pid))
                    .map(|i| PlaneSlot(i as u8))
            });
            let slot = match slot {
                Some(s) => s,
                None => {
                    self.dp.counters.vnic_rejected += 1;
                    if worth_logging(self.dp.counters.vnic_rejected) {
                        let (pid, uid) = peer.map_or((0, u32::MAX), |c| (c.pid, c.uid));
                        let rejected = self.dp.counters.vnic_rejected;
                        tracing::warn!(target: "spillway::run", pid, uid, expected = ?want, rejected, "refused a vNIC connection that is not from the plane we started");
                    }
                    continue;
                }
            };
            let lanes = self.lanes();
            let p = self.planes[slot.index()].as_mut().expect("checked above");
            let checked = crate::shm::vnic::check_auth(
                &stream,
                &p.secret,
                std::time::Duration::from_millis(1000),
            );
            if let Err(e) = checked {
                self.dp.counters.vnic_rejected += 1;
                let e = format!("vNIC handshake: {e}");
                self.plane_failed_in(slot, now, &e);
                return;
            }
            match VnicSet::create(stream, &format!("workers={}", p.workers), lanes) {
                Ok(mut v) => {
                    // Lane k to forwarding thread k, which serves shard k's connections.
                    let lanes = v.take_lanes();
                    if let Some(l) = self.links.as_mut() {
                        for lane in lanes {
                            let k = lane.index();
                            let lane = Box::new(lane);
                            let plane = p.number;
                            l.send(k, Parcel::Lane { lane, plane, slot });
                        }
                    }
                    // The plane's delivery path, then every attached VM's memory.
                    if let Err(e) = v.send_json(CONTROL_COMMAND, &json!({"vatc": self.vatc})) {
                        let e = e.to_string();
                        self.plane_failed_in(slot, now, &e);
                        return;
                    }
                    p.vnic = Some(v);
                    let attached: Vec<VmChange> = self
                        .dp
                        .ports
                        .iter()
                        .filter(|p| match &p.io {
                            PortIo::Shm(s) => s.port.is_some(),
                            PortIo::VhostUser(s) => s.lent.is_some(),
                            PortIo::Tap(_) => false,
                        })
                        .map(|p| VmChange::Attached(p.id))
                        .collect();
                    self.tell_plane_in(slot, &attached);
                }
                Err(e) => {
                    let e = e.to_string();
                    self.plane_failed_in(slot, now, &e);
                    return;
                }
            }
        }
        for slot in [PlaneSlot(0), PlaneSlot(1)] {
            if let Some(p) = self.planes[slot.index()].as_mut()
                && let Ok(Some(status)) = p.child.try_wait()
            {
                let why = format!("process exited ({status})");
                self.plane_failed_in(slot, now, &why);
            }
        }
        self.reap_retired();
    }

    /// Sends every connected plane each shared-memory port change since the last call.
    pub(super) fn tell_plane_vm_changes(&mut self) {
        if self.dp.vm_changes.is_empty() {
            return;
        }
        let changes = std::mem::take(&mut self.dp.vm_changes);
        for slot in [PlaneSlot(0), PlaneSlot(1)] {
            self.tell_plane_in(slot, &changes);
        }
    }

    /// Sends the plane in `slot` (if connected) the port changes `changes`: an attach hands it
    /// the VM's memory and interrupt eventfd; a detach is a vATC invalidation at the VM's new
    /// epoch. A plane that cannot take them has failed.
    fn tell_plane_in(&mut self, slot: PlaneSlot, changes: &[VmChange]) {
        let Some(v) = self.planes[slot.index()]
            .as_mut()
            .and_then(|p| p.vnic.as_mut())
        else {
            return;
        };
        let mut failure = None;
        for c in changes {
            let r = match *c {
                VmChange::Attached(id) => {
                    let Some(i) = self.dp.port_slot(id) else {
                        continue;
                    };
                    let vm = vm_id(id);
                    let epoch = self.dp.authority.epoch(vm);
                    match &self.dp.ports[i].io {
                        PortIo::Shm(s) => {
                            let Some(port) = s.port.as_ref() else {
                                continue;
                            };
                            v.send_vm(
                                &VatcMsg::Attach {
                                    vm,
                                    port: id.0,
                                    epoch,
                                },
                                &[port.mem.fd(), port.irq_fd()],
                            )
                        }
                        PortIo::VhostUser(s) => {
                            let Some(l) = s.lent.as_ref() else {
                                continue;
                            };
                            let mut fds = vec![s.dev().lease.fd(), l.call.as_fd()];
                            fds.extend(l.table.iter().map(|t| std::os::fd::AsFd::as_fd(&t.fd)));
                            v.send_vm(
                                &VatcMsg::AttachGuest {
                                    vm,
                                    port: id.0,
                                    epoch,
                                    lend: LendSpec {
                                        number: l.number,
                                        features: l.features,
                                        ring: l.ring,
                                        regions: l.table.iter().map(|t| t.region).collect(),
                                    },
                                },
                                &fds,
                            )
                        }
                        PortIo::Tap(_) => continue,
                    }
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
            self.plane_failed_in(slot, now, &e);
        }
    }

    /// Sends an operator's command to every connected plane (the warm one takes it too, so a
    /// flip changes nothing an operator set); an error if no plane is connected or one could
    /// not take it (that plane has then failed).
    pub(super) fn send_plane_command(&mut self, doc: serde_json::Value) -> Result<(), String> {
        let mut sent = false;
        let mut failure = None;
        for slot in [PlaneSlot(0), PlaneSlot(1)] {
            let Some(v) = self.planes[slot.index()]
                .as_mut()
                .and_then(|p| p.vnic.as_mut())
            else {
                continue;
            };
            match v.send_json(CONTROL_COMMAND, &doc) {
                Ok(()) => sent = true,
                Err(e) => failure = Some((slot, e.to_string())),
            }
        }
        if let Some((slot, e)) = failure {
            let now = self.clock.now();
            self.plane_failed_in(slot, now, &e);
            return Err(e);
        }
        if sent {
            Ok(())
        } else {
            Err("no spill plane is running".into())
        }
    }
}
