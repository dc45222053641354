//! Bringing the DPU process up ([`DpuDaemon::start`]): recovering a crashed predecessor's
//! leftovers, the VMs' namespaces and ports (TAPs, shared-memory port sockets and their bridge
//! endpoints), the DPU node, the plane's cgroup and vNIC socket, the ctl socket and the metrics
//! endpoint, each recorded in the ledger so that a failed start removes what it made.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use spillway_fabric::atc::RegionTable;
use spillway_fabric::dpu::Hold;
use spillway_vswitch::packet::HEADROOM;
use spillway_vswitch::{Instant, PacketBuf};

use crate::dpu::daemon::{DpuDaemon, Rates, RunError, RunOptions, Spin, io_err};
use crate::dpu::ports::{
    DataPath, FRAME_MAX, Port, PortIo, RtCounters, ShmSlot, VhostSlot, tap_ring,
};
use crate::dpu::vmport;
use crate::host::cgroup::CgroupSpec;
use crate::host::clock::Clock;
use crate::host::ledger::{Ledger, LedgerEntry};
use crate::host::tap::Tap;
use crate::ops::ctl::CtlServer;
use crate::ops::metrics::{MetricsServer, Snapshot};
use crate::testbed::{InitialHold, TapIo, Testbed, VhostEndpoint, VmBackend, VmEndpoint, VmSpec};
use crate::vm::qemu::{Accel, GuestSpec, QemuGuest};
use crate::vm::vhost_user::conn::{Backend, SocketMode};

impl DpuDaemon {
    /// Brings the testbed up: recovers a crashed predecessor's leftovers, creates the
    /// namespaces and TAPs, the plane's cgroup and sockets, the ctl socket and the metrics
    /// endpoint.
    pub fn start(opts: RunOptions) -> Result<DpuDaemon, RunError> {
        let tb = opts.testbed;
        // Into the host's namespace first: every thread and child made from here on is in it.
        if let Some(ns) = &tb.netns {
            crate::host::netns::enter(ns).map_err(RunError::Setup)?;
        }
        crate::host::ledger::secure_state_dir(&tb.state_dir)
            .map_err(|e| RunError::Setup(format!("state directory: {e}")))?;
        // What a crashed predecessor of this testbed could have created, and nothing else.
        let mut scope = crate::host::ledger::LedgerScope::new(&tb.state_dir, &tb.name)
            .allow_exe(&opts.plane_exe);
        // The QEMU of the guests this run boots, which a crashed run may have left.
        let qemu = tb
            .vms
            .iter()
            .any(|v| v.backend == VmBackend::VhostUser(VhostEndpoint::Qemu))
            .then(|| {
                crate::host::netns::find_on_path(QEMU).ok_or_else(|| {
                    RunError::Setup(format!(
                        "{QEMU} is not on PATH (Debian: apt-get install qemu-system-x86)"
                    ))
                })
            })
            .transpose()?;
        if let Some(q) = &qemu {
            scope = scope.allow_exe(q);
        }
        for vm in &tb.vms {
            scope = scope.allow_netns(&vm.netns).allow_link(&vm.tap);
        }
        if let Some(u) = &tb.uplink {
            scope = scope.allow_link(&u.tap);
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
        let brought = crate::dpu::bringup::bring_up(&tb, &mut ledger)
            .and_then(|vms| Ok((vms, crate::dpu::bringup::bring_up_uplink(&tb, &mut ledger)?)));
        let (ports, uplink) = match brought {
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
                    (VmBackend::VhostUser(how), _) => {
                        let slot = vhost_port(&tb, &spec, how, qemu.as_deref(), ledger)?;
                        PortIo::VhostUser(Box::new(slot))
                    }
                    (VmBackend::Tap, None) => unreachable!("bring_up makes a TAP for a TAP port"),
                };
                out.push(Port {
                    id: spec.port,
                    io,
                    file: None,
                });
            }
            if let (Some(u), Some(tap)) = (&tb.uplink, uplink) {
                out.push(Port {
                    id: u.port,
                    io: PortIo::Tap(tap),
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
                TapIo::Uring => tap_ring(&mut ports, tb.vnet_hdr),
                TapIo::Syscalls => (None, Vec::new()),
            };
            let clock = Clock::start();
            let (mut sw, threads) =
                crate::dpu::forward::start(&tb.fabric, &tb.policy, &ports, tb.vnet_hdr, clock)
                    .map_err(RunError::Setup)?;
            let (links, fwd) = threads.unzip();
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
            let cluster = match &tb.cluster {
                None => None,
                Some(spec) => Some(
                    crate::ops::cluster::ClusterAgent::start(spec)
                        .map_err(|e| RunError::Setup(format!("cluster agent: {e}")))?,
                ),
            };
            let pool = match &tb.cluster {
                Some(spec) if spec.pool_listen.is_some() => Some(
                    crate::remote::pool::PoolService::start(pool_spec(&tb, spec, &opts.plane_exe)?)
                        .map_err(|e| RunError::Setup(format!("pool service: {e}")))?,
                ),
                _ => None,
            };
            let now = clock.now();
            match tb.hold {
                InitialHold::Auto => {}
                InitialHold::Active => sw.dpu_mut().handle_hold(now, Hold::Active),
                InitialHold::Released => sw.dpu_mut().handle_hold(now, Hold::Released),
            }
            Ok(DpuDaemon {
                sw,
                links,
                fwd,
                taps,
                dp: DataPath {
                    ports,
                    port_index,
                    tap_slots,
                    vnet_hdr: tb.vnet_hdr,
                    counters: RtCounters::default(),
                    authority: RegionTable::new(),
                    vm_changes: Vec::new(),
                    scratch: vec![0u8; FRAME_MAX].into_boxed_slice(),
                },
                clock,
                planes: [None, None],
                retiring: Vec::new(),
                reclaimed: Default::default(),
                plane_exe: opts.plane_exe.clone(),
                listener,
                vnic_path,
                cgroup,
                ledger: None,
                ctl: Some(ctl),
                metrics,
                publisher,
                cluster,
                last_cluster: Instant::ZERO,
                last_record: Instant::ZERO,
                pool,
                events: VecDeque::new(),
                activations: Vec::new(),
                last_prepare: None,
                last_publish: Instant::ZERO,
                last_manage: Instant::ZERO,
                spin: Spin::default(),
                turn: 0,
                rates: Rates::default(),
                rx: PacketBuf::with_capacity(HEADROOM + FRAME_MAX),
                poll_set: Vec::new(),
                allocs: Default::default(),
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
}

/// What the pool service of `spec` (which has a `pool_listen`) runs with: this testbed's
/// `[spill]` for every guest's plane.
fn pool_spec(
    tb: &Testbed,
    spec: &crate::testbed::ClusterSpec,
    plane_exe: &Path,
) -> Result<crate::remote::pool::PoolSpec, RunError> {
    let text = std::fs::read_to_string(&tb.file)
        .map_err(io_err(format!("reading {}", tb.file.display())))?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| RunError::Setup(format!("{}: {e}", tb.file.display())))?;
    let spill = match table.remove("spill") {
        Some(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    Ok(crate::remote::pool::PoolSpec {
        pool_host: spec.host.clone(),
        listen: spec.pool_listen.expect("called with a pool_listen"),
        netns: spec.netns.clone(),
        etcd: spec.etcd.clone(),
        state_dir: tb.state_dir.clone(),
        instance: format!("{}-pool", tb.name),
        plane_exe: plane_exe.to_owned(),
        cpus: spec
            .pool_cpus
            .clone()
            .unwrap_or_else(|| tb.spill_cpus.clone()),
        memory_max: tb.spill_memory_max,
        spill,
        cores: spec.pool_cores,
    })
}

/// The QEMU binary a `backend = "vhost-user"` guest runs on.
const QEMU: &str = "qemu-system-x86_64";

/// The vhost-user socket of VM `vm` (QEMU listens on it; the DPU process connects).
pub fn vhost_socket(tb: &Testbed, vm: &str) -> std::path::PathBuf {
    tb.state_dir.join(format!("{}-vm-{vm}.vhost.sock", tb.name))
}

/// The serial console log of the guest of VM `vm` that `spillway run` boots.
pub fn guest_console(tb: &Testbed, vm: &str) -> std::path::PathBuf {
    tb.state_dir.join(format!("{}-vm-{vm}.console", tb.name))
}

/// A vhost-user port: its backend (connecting to QEMU's socket, retrying until it is there)
/// and, with `endpoint = "qemu"`, the guest, booted with the policy port's MAC and address.
fn vhost_port(
    tb: &Testbed,
    spec: &VmSpec,
    how: VhostEndpoint,
    qemu: Option<&Path>,
    ledger: &mut Ledger,
) -> Result<VhostSlot, RunError> {
    let sock = vhost_socket(tb, &spec.name);
    let record = |ledger: &mut Ledger, p: &Path| {
        ledger
            .record(LedgerEntry::File(p.to_owned()))
            .map_err(|e| RunError::Setup(format!("ledger: {e}")))
    };
    if how == VhostEndpoint::Qemu {
        // The socket of the QEMU this run starts is this run's; an external QEMU's is its own
        // (it outlives this process, which connects to it again when it restarts).
        crate::host::unixsock::remove_stale(&sock)
            .map_err(io_err(format!("socket {}", sock.display())))?;
        record(ledger, &sock)?;
    }
    let backend = Backend::start(&spec.name, SocketMode::Connect(sock.clone()), spec.uid)
        .map_err(RunError::Setup)?;
    let guest = match (how, qemu) {
        (VhostEndpoint::Qemu, Some(qemu)) => {
            let console = guest_console(tb, &spec.name);
            record(ledger, &console)?;
            record(ledger, &crate::vm::qemu::qemu_log_path(&console))?;
            let mut cmdline = format!("spillway.ip={}/{}", spec.ip, spec.prefix_len);
            if let Some(gw) = spec.gateway {
                cmdline += &format!(" spillway.gw={gw}");
            }
            if !spec.guest_cmdline.is_empty() {
                cmdline += " ";
                cmdline += &spec.guest_cmdline;
            }
            let gs = GuestSpec {
                qemu: qemu.to_path_buf(),
                kernel: tb.guest_dir.join("vmlinuz"),
                initrd: tb.guest_dir.join("initramfs.cpio.gz"),
                memory_mib: spec.memory_mib,
                cpus: spec.cpus,
                cmdline,
                console_log: console,
                accel: Accel::Auto,
                netdev: crate::vm::qemu::vhost_user_nic(&sock, &spec.mac.to_string()),
            };
            let g = QemuGuest::start(&gs)
                .map_err(|e| RunError::Setup(format!("vm {}: {e}", spec.name)))?;
            if let Some(pid) = g.pid() {
                let entry = LedgerEntry::pid(pid)
                    .map_err(io_err(format!("vm {}: QEMU {pid}", spec.name)))?;
                ledger
                    .record(entry)
                    .map_err(|e| RunError::Setup(format!("ledger: {e}")))?;
            }
            tracing::info!(target: "spillway::run", vm = %spec.name, accel = g.accel().name(), pid = ?g.pid(), "guest started");
            Some(g)
        }
        _ => None,
    };
    Ok(VhostSlot {
        vm: spec.name.clone(),
        backend,
        guest,
        seen: u64::MAX,
        kicks: Default::default(),
        tx_turn: 0,
        lent: None,
        lends: 0,
        budget: Default::default(),
    })
}

/// [`Ledger::bind_socket`], its error a set-up error.
fn bind_and_record(
    ledger: &mut Ledger,
    path: &Path,
    owner: Option<u32>,
) -> Result<UnixListener, RunError> {
    ledger
        .bind_socket(path, owner)
        .map_err(|e| RunError::Setup(format!("socket {}: {e}", path.display())))
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
