//! The daemon's methods that start, stop and watch the spill plane's process ([`PlaneProc`]):
//! accepting (and authenticating) its vNIC connection, failing open when it dies or breaks the
//! protocol, and telling it of shared-memory port changes and operator commands. The daemon
//! (`daemon.rs`) calls these from its outputs (`after_input`) and its upkeep.

use crate::dpu::daemon::DpuDaemon;
use crate::dpu::forward::Parcel;
use crate::dpu::plane_proc::PlaneProc;
use crate::dpu::ports::{PortIo, VmChange, vm_id, worth_logging};
use crate::shm::codec::VatcMsg;
use crate::shm::vnic::{CONTROL_COMMAND, VnicSet};
use serde_json::json;
use spillway_vswitch::Instant;
use std::process::{Command, Stdio};

/// Connections taken from the vNIC socket per loop turn.
const VNIC_ACCEPTS_PER_TURN: usize = 16;

/// The daemon's side of the plane's process.
impl DpuDaemon {
    /// Lanes of the plane's vNIC set: one per forwarding thread.
    pub(super) fn lanes(&self) -> usize {
        self.links.as_ref().map_or(1, |l| l.threads())
    }

    /// Tells every forwarding thread to drop its lane of the plane that is going.
    fn close_lanes(&mut self) {
        if let Some(l) = self.links.as_mut() {
            let me = l.me();
            for k in (0..l.threads()).filter(|&k| k != me) {
                l.send(k, Parcel::LaneClosed);
            }
        }
    }

    pub(super) fn plane_failed(&mut self, now: Instant, why: &str) {
        if let Some(p) = self.plane.take() {
            self.close_lanes();
            self.dp.counters.plane_failures += 1;
            tracing::warn!(target: "spillway::run", reason = why, "spill plane failed; failing open");
            p.kill();
            self.sw
                .dpu_mut()
                .handle_plane_failed(now, &format!("spill plane failed: {why}"));
        }
    }

    pub(super) fn start_plane(&mut self, now: Instant, workers: u32) {
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

    pub(super) fn stop_plane(&mut self) {
        if let Some(p) = self.plane.take() {
            self.close_lanes();
            p.stop();
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
            let lanes = self.lanes();
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
            match VnicSet::create(stream, &format!("workers={}", p.workers), lanes) {
                Ok(mut v) => {
                    // Lane k to forwarding thread k, which serves shard k's connections.
                    let lanes = v.take_lanes();
                    if let Some(l) = self.links.as_mut() {
                        let plane = self.dp.counters.plane_starts;
                        for lane in lanes {
                            let k = lane.index();
                            l.send(
                                k,
                                Parcel::Lane {
                                    lane: Box::new(lane),
                                    plane,
                                },
                            );
                        }
                    }
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

    /// Sends the plane every shared-memory port change since the last call: an attach hands it
    /// the VM's memory and interrupt eventfd; a detach is a vATC invalidation at the VM's new
    /// epoch.
    pub(super) fn tell_plane_vm_changes(&mut self) {
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

    pub(super) fn send_plane_command(&mut self, doc: serde_json::Value) -> Result<(), String> {
        match self.plane.as_mut().and_then(|p| p.vnic.as_mut()) {
            Some(v) => v
                .send_json(CONTROL_COMMAND, &doc)
                .map_err(|e| e.to_string()),
            None => Err("no spill plane is running".into()),
        }
    }
}
