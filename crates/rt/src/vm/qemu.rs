//! A QEMU guest as the DPU process will run one (issue 18): the small guest `guest/build.sh`
//! builds (a Debian kernel and a busybox initramfs), booted directly (`-kernel`, `-initrd`)
//! with its memory in a shared memfd (`memory-backend-memfd,share=on`, which a vhost-user
//! backend needs to map it) and its serial console captured to a log file. [`QemuGuest`] is the
//! process: started, watched for a line on its console, stopped (and reaped) when dropped.
//!
//! **Acceleration.** KVM where `/dev/kvm` opens, software emulation (TCG) otherwise. A KVM
//! that opens but does not run a guest (nested virtualisation on some hosts: the guest prints
//! nothing) is caught by a probe: with [`Accel::Auto`], a guest on KVM that has written nothing
//! to its console within [`KVM_PROBE`] is stopped and started again under TCG, and
//! [`QemuGuest::accel`] says which ran. The warning names the reason, so a slow boot is never a
//! mystery.
//!
//! **The network device.** [`vhost_user_nic`] gives the arguments of a `virtio-net` device whose
//! backend is a vhost-user socket ([`crate::vm::vhost_user`]), with the device options QEMU 7.2
//! needs to run one (docs/adr/0013-vhost-user.md); [`GuestSpec::netdev`] takes them.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::vhost_user::device::QUEUE_PAIRS;

/// How long a guest on KVM has to print its first console byte before [`Accel::Auto`] falls
/// back to TCG. A kernel on KVM prints within a fraction of a second; under TCG the firmware
/// and the decompression take about a second on this machine.
pub const KVM_PROBE: Duration = Duration::from_secs(5);

/// Which accelerator to run the guest on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// KVM if `/dev/kvm` opens and runs the guest (see the module doc), TCG otherwise.
    Auto,
    /// KVM only: an error if `/dev/kvm` does not open.
    Kvm,
    /// Software emulation, slowly.
    Tcg,
}

impl Accel {
    /// Its name as QEMU's `-accel` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Accel::Auto => "auto",
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// What to boot.
#[derive(Clone, Debug)]
pub struct GuestSpec {
    /// The QEMU binary (`qemu-system-x86_64`).
    pub qemu: PathBuf,
    /// The kernel and the initramfs (`guest/build.sh`'s `vmlinuz` and `initramfs.cpio.gz`).
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// Guest memory, MiB.
    pub memory_mib: u32,
    /// Virtual CPUs (`-smp`).
    pub cpus: u32,
    /// Kernel command line after `console=ttyS0`, e.g. `spillway.ip=10.66.0.3/24`.
    pub cmdline: String,
    /// Where the serial console goes.
    pub console_log: PathBuf,
    pub accel: Accel,
    /// Extra QEMU arguments for the network device, if any.
    pub netdev: Vec<String>,
}

/// Why a guest did not start or did not get where it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error("{path}: {source}")]
    Missing { path: PathBuf, source: io::Error },
    #[error("starting {qemu}: {source}")]
    Spawn { qemu: PathBuf, source: io::Error },
    #[error("accel = \"kvm\" but /dev/kvm does not open: {0}")]
    NoKvm(io::Error),
    #[error(
        "QEMU exited ({status}) before the guest printed {want:?}; its console and messages: {tail}"
    )]
    Exited {
        status: std::process::ExitStatus,
        want: String,
        tail: String,
    },
    #[error(
        "the guest did not print {want:?} within {waited:?} (accel {accel}); its console: {tail}"
    )]
    Timeout {
        want: String,
        waited: Duration,
        accel: &'static str,
        tail: String,
    },
    #[error("reading the console log {path}: {source}")]
    Log { path: PathBuf, source: io::Error },
}

/// A running guest. Dropping it kills and reaps QEMU.
#[derive(Debug)]
pub struct QemuGuest {
    child: Option<Child>,
    spec: GuestSpec,
    accel: Accel,
}

impl QemuGuest {
    /// Starts the guest (see the module doc for [`Accel::Auto`]'s probe).
    pub fn start(spec: &GuestSpec) -> Result<QemuGuest, QemuError> {
        for path in [&spec.kernel, &spec.initrd] {
            std::fs::metadata(path).map_err(|source| QemuError::Missing {
                path: path.clone(),
                source,
            })?;
        }
        let kvm = kvm_opens();
        let accel = match (spec.accel, kvm) {
            (Accel::Kvm, Err(e)) => return Err(QemuError::NoKvm(e)),
            (Accel::Kvm | Accel::Auto, Ok(())) => Accel::Kvm,
            (Accel::Auto, Err(e)) => {
                tracing::warn!(target: "spillway::run", error = %e, "/dev/kvm does not open; the guest runs under TCG (slowly)");
                Accel::Tcg
            }
            (Accel::Tcg, _) => Accel::Tcg,
        };
        let mut guest = QemuGuest::spawn(spec, accel)?;
        if spec.accel == Accel::Auto && accel == Accel::Kvm && !guest.prints_within(KVM_PROBE)? {
            tracing::warn!(target: "spillway::run", probe = ?KVM_PROBE, "/dev/kvm opens but the guest printed nothing (nested virtualisation?); it runs under TCG (slowly)");
            guest.kill();
            guest = QemuGuest::spawn(spec, Accel::Tcg)?;
        }
        Ok(guest)
    }

    fn spawn(spec: &GuestSpec, accel: Accel) -> Result<QemuGuest, QemuError> {
        // A fresh log: the probe and `wait_for` read it from the start.
        std::fs::write(&spec.console_log, b"").map_err(|source| QemuError::Log {
            path: spec.console_log.clone(),
            source,
        })?;
        let mem = format!(
            "memory-backend-memfd,id=mem,size={}M,share=on",
            spec.memory_mib
        );
        // QEMU's own messages next to the console (`<console>.qemu`): a failure quotes them.
        let qemu_log =
            std::fs::File::create(qemu_log_path(&spec.console_log)).map_err(|source| {
                QemuError::Log {
                    path: qemu_log_path(&spec.console_log),
                    source,
                }
            })?;
        let mut cmd = Command::new(&spec.qemu);
        cmd.args(["-accel", accel.name()]);
        if accel == Accel::Kvm {
            // `host` minus what some hosts refuse to set for a guest (MSR 0x10a).
            cmd.args(["-cpu", "host,-arch-capabilities"]);
        }
        cmd.args(["-m", &spec.memory_mib.to_string()])
            .args(["-smp", &spec.cpus.to_string()])
            .args(["-nodefaults", "-no-user-config", "-display", "none"])
            .args(["-no-reboot", "-object", &mem, "-numa", "node,memdev=mem"])
            .arg("-kernel")
            .arg(&spec.kernel)
            .arg("-initrd")
            .arg(&spec.initrd)
            .args([
                "-append",
                &format!("console=ttyS0 panic=-1 {}", spec.cmdline),
            ])
            .arg("-serial")
            .arg(format!("file:{}", spec.console_log.display()))
            .args(&spec.netdev)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(qemu_log));
        let child = cmd.spawn().map_err(|source| QemuError::Spawn {
            qemu: spec.qemu.clone(),
            source,
        })?;
        tracing::info!(target: "spillway::run", pid = child.id(), accel = accel.name(), kernel = %spec.kernel.display(), "guest started");
        Ok(QemuGuest {
            child: Some(child),
            spec: spec.clone(),
            accel,
        })
    }

    /// The accelerator the guest runs on.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// QEMU's pid.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The console so far.
    pub fn console(&self) -> Result<String, QemuError> {
        std::fs::read(&self.spec.console_log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|source| QemuError::Log {
                path: self.spec.console_log.clone(),
                source,
            })
    }

    /// Waits until the console has a line containing `want`; returns that line.
    pub fn wait_for(&mut self, want: &str, within: Duration) -> Result<String, QemuError> {
        let start = Instant::now();
        loop {
            let text = self.console()?;
            if let Some(line) = text.lines().find(|l| l.contains(want)) {
                return Ok(line.trim().to_string());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(QemuError::Exited {
                    status,
                    want: want.into(),
                    tail: self.tails(&text),
                });
            }
            if start.elapsed() >= within {
                return Err(QemuError::Timeout {
                    want: want.into(),
                    waited: within,
                    accel: self.accel.name(),
                    tail: self.tails(&text),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The end of the console `text` and of QEMU's own messages, for an error.
    fn tails(&self, text: &str) -> String {
        let qemu = std::fs::read(qemu_log_path(&self.spec.console_log))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        format!("{} || QEMU: {}", tail(text), tail(&qemu))
    }

    /// Whether the console gets any output within `within` (false also if QEMU exits).
    fn prints_within(&mut self, within: Duration) -> Result<bool, QemuError> {
        let start = Instant::now();
        while start.elapsed() < within {
            if !self.console()?.is_empty() {
                return Ok(true);
            }
            if self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
            {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(false)
    }

    /// Kills and reaps QEMU (also on drop).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for QemuGuest {
    fn drop(&mut self) {
        self.kill();
    }
}

/// QEMU arguments for a `virtio-net-pci` device with MAC `mac` on a vhost-user socket QEMU
/// listens on at `sock` (`server=on,wait=off`: the backend connects, and connects again when
/// QEMU restarts, as OVS's `dpdkvhostuserclient` ports do).
///
/// Two queue pairs (`queues=2`, `mq=on`, and the control queue the driver sets their number
/// with): the second pair's receive queue is the spill plane's (`device::PLANE_RX`); a guest
/// with one CPU runs only the first.
///
/// No MSI-X (`vectors=0`): without KVM's irqfds, Debian's QEMU 7.2 unmasks a vhost-user vector
/// through an irqfd table it never allocated, and crashes (SIGSEGV in
/// `msix_set_vector_notifiers`; with the control queue on as well, in `vhost_net_start`).
/// Interrupts go by INTx through QEMU's main loop instead; with them the control queue and
/// both pairs run (`qemu_guest.rs`).
pub fn vhost_user_nic(sock: &Path, mac: &str) -> Vec<String> {
    vec![
        "-chardev".into(),
        format!("socket,id=vu0,path={},server=on,wait=off", sock.display()),
        "-netdev".into(),
        format!("vhost-user,id=n0,chardev=vu0,queues={QUEUE_PAIRS}"),
        "-device".into(),
        format!("virtio-net-pci,netdev=n0,mac={mac},mq=on,vectors=0"),
    ]
}

/// Where QEMU's own messages (its stderr) go: beside the console log, `.qemu` appended.
pub fn qemu_log_path(console: &Path) -> PathBuf {
    let mut p = console.as_os_str().to_owned();
    p.push(".qemu");
    PathBuf::from(p)
}

/// Whether `/dev/kvm` opens for reading and writing.
fn kvm_opens() -> io::Result<()> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new("/dev/kvm"))
        .map(drop)
}

/// The last lines of a console, for an error (bounded: a console can be long).
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(8);
    let t = lines[from..].join(" | ");
    let cut = t.len().saturating_sub(800);
    let cut = (cut..t.len())
        .find(|&i| t.is_char_boundary(i))
        .unwrap_or(t.len());
    t[cut..].to_string()
}
