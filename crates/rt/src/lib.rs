//! # spillway-rt
//!
//! The real-time driver of the fabric core, and the only crate that talks to the operating
//! system: `spillway run` brings up tenant VMs as network namespaces on TAP devices
//! ([`testbed`], [`dpu::bringup`], [`host::tap`], [`host::netns`]), runs the emulated DPU in
//! real time between them ([`dpu::daemon`]), starts the spill plane as a separate process in
//! its own cgroup ([`plane::process`], [`host::cgroup`]) connected by shared-memory rings
//! ([`shm::ring`], [`shm::vnic`], [`shm::fdpass`]), and serves `spillway ctl` ([`ops::ctl`])
//! and a Prometheus endpoint ([`ops::metrics`]).
//!
//! ## Layout
//!
//! - [`host`]: the operating system: TAP, namespaces and links, cgroups, the cleanup ledger,
//!   signals, clock, privileges, Unix sockets, the virtio-net header.
//! - [`shm`]: the shared-memory protocol between processes: rings, virtio queues, the record
//!   codec, the vNIC set, fd passing.
//! - [`ops`]: operator interfaces: control socket, metrics endpoint, logging.
//! - [`dpu`]: the DPU process: daemon loop, VM bring-up, shared-memory VM ports.
//! - [`plane`]: the spill-plane process.
//! - [`remote`]: a spill plane on a pool host's cores: the relay a host starts as its plane,
//!   the pool host's service, and the record link between them over TCP.
//! - [`shards`]: a model's control part on one thread and its shards on others (the DPU's
//!   forwarding threads, the plane's threads): the shared budget and the request transport.
//! - [`vm`]: the VM side of a shared-memory port (`spillway vm-endpoint`), a QEMU guest, and the
//!   vhost-user backend of a QEMU guest's virtio-net device ([`vm::vhost_user`]).
//! - [`testbed`]: the testbed description all of them read.
//!
//! ## Main types
//!
//! - [`dpu::daemon::DpuDaemon`]: the DPU process, an I/O shell around the core's frame node
//!   `spillway_fabric::frame::DpuSwitch` (the `DpuNode` model and the DPU's vSwitch).
//! - [`plane::process::run`]: the spill-plane process, the same around `PlaneSwitch`.
//! - [`shm::vnic::VnicSet`]: one end of the vNIC set; [`shm::ring::SharedRing`] the memfd ring
//!   under it.
//! - [`host::ledger::Ledger`]: the crash-safe record of everything a testbed creates.
//!
//! ## Invariants
//!
//! - The driver holds no policy: every decision (fast path, slow path, steer, drop, recall,
//!   activate, release, which snapshot to adopt, what to mirror) is the core's, returned as one
//!   outcome per frame; the driver moves frames and messages and counts what it could not move
//!   (`rt.drop.plane_gone`, `rt.tx.errors`, ...).
//! - Everything created is recorded in the ledger before it exists, and removed on exit, on
//!   Ctrl-C, and by the next start after a crash.
//! - Shared memory from the other process is untrusted: every length read from a ring is
//!   bounds-checked, every record decoded with typed errors ([`shm::codec`]).
//!
//! `README.md` beside this crate explains the processes, the rings and the cleanup rules.
//!
//! ## Example
//!
//! ```no_run
//! use spillway_rt::dpu::daemon::{DpuDaemon, RunOptions};
//! use spillway_rt::testbed::Testbed;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let testbed = Testbed::load("examples/testbed-two-vms.toml".as_ref())?;
//! spillway_rt::host::signals::install()?;
//! let daemon = DpuDaemon::start(RunOptions {
//!     testbed,
//!     plane_exe: std::env::current_exe()?,
//!     ready_file: None,
//! })?;
//! let report = daemon.run()?; // until SIGINT / SIGTERM; then everything is removed
//! println!("{:?}", report.activations);
//! # Ok(()) }
//! ```

pub mod dpu;
pub mod host;
pub mod ops;
pub mod plane;
pub mod remote;
pub mod shards;
pub mod shm;
pub mod testbed;
pub mod vm;

#[cfg(test)]
pub(crate) mod test_support {
    /// Whether to run the body of the test `name` here: false in the test process, which
    /// runs `name` again in a child process of its own and checks that it passed; true in
    /// that child. For tests that change per-process state such as the umask, which would
    /// race with every other test of this binary creating files meanwhile.
    pub(crate) fn in_own_process(name: &str) -> bool {
        const CHILD: &str = "SPILLWAY_TEST_OWN_PROCESS";
        if std::env::var_os(CHILD).is_some() {
            return true;
        }
        let exe = std::env::current_exe().expect("the test binary has a path");
        let out = std::process::Command::new(exe)
            .args([name, "--exact", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .expect("running the test binary again");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{name} in a process of its own: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        false
    }
}
