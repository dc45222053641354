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
    spillway_testkit::small_guest(&root())
}

fn spec(dir: &Path, log: &Path) -> GuestSpec {
    GuestSpec {
        qemu: "qemu-system-x86_64".into(),
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initramfs.cpio.gz"),
        memory_mib: 256,
        cpus: 2,
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

/// The guest's virtio-net device on the vhost-user backend ([`Backend`]), with no switch
/// behind it: QEMU 7.2 sets the device up (its ordering included; the backend connects to
/// QEMU's socket, and again when the KVM probe restarts QEMU under TCG), the guest's driver
/// starts, and the ARP requests its `ping` sends arrive on the backend's transmit queue; an ARP
/// reply written into its receive queue makes the guest send the ICMP echo itself.
#[test]
fn a_guest_nic_on_the_vhost_user_backend_carries_frames_both_ways() {
    use spillway_rt::vm::vhost_user::conn::{Backend, SocketMode};
    use spillway_rt::vm::vhost_user::device::{self, NET_HDR_LEN};
    let Some(dir) = guest() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("vm.sock");
    let backend = Backend::start("q", SocketMode::Connect(sock.clone()), 0).unwrap();
    let mut s = spec(&dir, &tmp.path().join("console.log"));
    s.cmdline = "spillway.ip=10.99.0.2/24 spillway.ping=10.99.0.1".into();
    s.netdev = spillway_rt::vm::qemu::vhost_user_nic(&sock, "02:00:00:00:99:02");
    let mut g = QemuGuest::start(&s).expect("QEMU starts");
    g.wait_for("spillway-guest ready", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut area = vec![0u8; 2048];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (mut arp, mut icmp) = (0, 0);
    let mut turn = 0;
    while std::time::Instant::now() < deadline && icmp == 0 {
        match device::recv(&backend.dev, &mut turn, &mut area) {
            Ok(Some(n)) => {
                let f = &area[NET_HDR_LEN..n];
                match (f.get(12..14), f.get(23)) {
                    (Some([0x08, 0x06]), _) if arp == 0 => {
                        arp += 1;
                        // Reply: 10.99.0.1 is at 02:00:00:00:99:01.
                        let mut r = Vec::with_capacity(42);
                        r.extend_from_slice(&f[6..12]);
                        r.extend_from_slice(&[2, 0, 0, 0, 0x99, 1, 0x08, 0x06]);
                        r.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
                        r.extend_from_slice(&[2, 0, 0, 0, 0x99, 1, 10, 99, 0, 1]);
                        r.extend_from_slice(&f[22..32]);
                        let _ = device::send(&backend.dev, &[0; NET_HDR_LEN], &r);
                        device::flush_irq(&backend.dev, device::RX);
                    }
                    (Some([0x08, 0x00]), Some(1)) => icmp += 1,
                    _ => {}
                }
                device::flush_irq(&backend.dev, device::TX);
                device::flush_irq(&backend.dev, device::TX2);
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    let mut console = g.console().unwrap();
    let qemu_log = tmp.path().join("console.log.qemu");
    console += &format!(
        "\nQEMU: {}",
        std::fs::read_to_string(&qemu_log).unwrap_or_default()
    );
    assert!(arp > 0, "no ARP request from the guest; console: {console}");
    assert!(
        icmp > 0,
        "no ICMP echo after the ARP reply; console: {console}"
    );
    // Both queue pairs run, and the guest posts receive buffers on the second one (the plane's).
    for q in 0..device::VRINGS {
        assert!(backend.dev.vring(q).live(), "vring {q} is not running");
    }
    let posted = device::available(&backend.dev, device::PLANE_RX);
    assert!(posted > 0, "no receive buffer on the plane's queue");
    eprintln!(
        "ARP then ICMP from a guest on {}; {posted} buffers on the plane's queue",
        g.accel().name()
    );
}
