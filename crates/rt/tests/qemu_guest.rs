//! The guest `guest/build.sh` builds boots under QEMU ([`QemuGuest`]) to its init's ready line,
//! on KVM or (where KVM is missing or runs no guest) TCG, says which, and is gone once dropped;
//! a missing kernel is an error naming the file. The test builds the guest itself if it is not
//! there yet (Debian packages through apt; `.ci/run` builds it beforehand) and fails loudly
//! under `CI=true` without QEMU.

use std::path::{Path, PathBuf};
use std::time::Duration;

use spillway_rt::vm::qemu::{Accel, GuestSpec, QemuError, QemuGuest};
use spillway_testkit::process_alive;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The guest's kernel and initramfs, built by `guest/build.sh` if they are not up to date.
fn guest() -> Option<PathBuf> {
    if !spillway_testkit::prerequisites(&["qemu-system-x86_64", "apt-get", "dpkg-deb", "cpio"]) {
        return None;
    }
    let dir = root().join("target/guest");
    let built = std::process::Command::new("bash")
        .arg(root().join("guest/build.sh"))
        .arg(&dir)
        .output()
        .expect("running guest/build.sh");
    assert!(
        built.status.success(),
        "guest/build.sh: {}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    Some(dir)
}

fn spec(dir: &Path, log: &Path) -> GuestSpec {
    GuestSpec {
        qemu: "qemu-system-x86_64".into(),
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initramfs.cpio.gz"),
        memory_mib: 256,
        cmdline: String::new(),
        console_log: log.to_path_buf(),
        accel: Accel::Auto,
        netdev: Vec::new(),
    }
}

#[test]
fn the_guest_boots_to_its_ready_line_and_is_gone_when_dropped() {
    let Some(dir) = guest() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("console.log");
    let mut g = QemuGuest::start(&spec(&dir, &log)).expect("QEMU starts");
    let line = g
        .wait_for("spillway-guest ready", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}"));
    let console = g.console().unwrap();
    eprintln!(
        "guest ready on {} ({} console lines): {line}",
        g.accel().name(),
        console.lines().count()
    );
    assert!(console.contains("Linux version"), "{console}");
    assert_ne!(g.accel(), Accel::Auto);
    let pid = g.pid().unwrap();
    assert!(process_alive(pid.into()));
    drop(g);
    assert!(!process_alive(pid.into()), "QEMU {pid} outlived its guest");
}

#[test]
fn a_missing_kernel_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let s = spec(tmp.path(), &tmp.path().join("console.log"));
    match QemuGuest::start(&s) {
        Err(e @ QemuError::Missing { .. }) => {
            assert!(e.to_string().contains("vmlinuz"), "{e}");
        }
        other => panic!("expected a missing kernel, got {other:?}"),
    }
}
