//! # spillway-testkit
//!
//! Test support shared by the Spillway crates: [`CountingAlloc`], a global allocator that
//! counts the allocations made by the current thread, for the tests that prove a hot path
//! allocates nothing per packet; and [`prerequisites`], the check with which a real-time test
//! that needs root and installed programs runs, skips, or (under `CI=true`) fails loudly.
//!
//! The per-thread counter is also what the `spillway` binary's own allocator bumps
//! ([`count_allocation`]), so the real-time driver can report its forwarding threads'
//! allocations (`spillway_rt::host::allocs`); that is why `spillway-rt` depends on this crate
//! outside its tests.
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: spillway_testkit::CountingAlloc = spillway_testkit::CountingAlloc;
//!
//! let before = spillway_testkit::allocations();
//! hot_path();
//! assert_eq!(spillway_testkit::allocations(), before);
//! ```
//!
//! Counting per thread keeps the test harness's own threads (output capture, other tests) out of
//! the tally.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::process::{Command, Stdio};

thread_local! {
    // `const` and `Drop`-free, so touching it never allocates or registers a destructor.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// Allocations (including reallocations) made by the current thread so far, when
/// [`CountingAlloc`] is the global allocator.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

/// Counts one allocation on the current thread: what [`CountingAlloc`] calls, and what another
/// global allocator calls to feed [`allocations`].
#[inline]
pub fn count_allocation() {
    // `try_with`: during thread teardown the slot may be gone; those allocations are not ours.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

/// The system allocator, counting allocations per thread. Install it with
/// `#[global_allocator]` in a test binary.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

// SAFETY: every method forwards to the system allocator with the caller's arguments unchanged;
// the only addition is a thread-local counter increment, which does not allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, which we pass on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Whether process `pid` exists and has not exited: a zombie (exited, not yet reaped) counts
/// as gone.
pub fn process_alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// Whether this process is root and every one of `programs` (names on `PATH`, or absolute
/// paths) can be run: true means the test can run. Otherwise it says why on stderr and returns
/// false (the test skips), except under `CI=true`, where `.ci/run` has installed everything and
/// a test must not skip silently: there it panics with the reason.
pub fn prerequisites(programs: &[&str]) -> bool {
    let root = rustix::process::geteuid().is_root();
    let missing: Vec<&str> = programs
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {p}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if root && missing.is_empty() {
        return true;
    }
    let why = format!("needs root (root: {root}) and programs (missing: {missing:?})");
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{why}: .ci/run installs them; under CI=true this test must not skip");
    }
    eprintln!("skipping: {why}");
    false
}

/// The small guest `guest/build.sh` builds (its folder, with `vmlinuz` and `initramfs.cpio.gz`),
/// built first if it is not up to date, for the tests that boot guests under QEMU; `None` where
/// [`prerequisites`] says to skip. `repo` is the repository's root.
pub fn small_guest(repo: &std::path::Path) -> Option<std::path::PathBuf> {
    if !prerequisites(&["qemu-system-x86_64", "apt-get", "dpkg-deb", "cpio"]) {
        return None;
    }
    let dir = repo.join("target/guest");
    let built = Command::new("bash")
        .arg(repo.join("guest/build.sh"))
        .arg(&dir)
        .output()
        .expect("running guest/build.sh");
    assert!(
        built.status.success(),
        "guest/build.sh: {}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    Some(dir.canonicalize().expect("the guest's folder"))
}

/// An etcd of a test's own (Debian's `etcd-server`): ports of its own (on loopback unless
/// started on another address) and a data folder
/// under the system's temporary folder, both gone when it is dropped (the process killed and
/// reaped, the folder removed), also when the test fails.
#[derive(Debug)]
pub struct Etcd {
    child: std::process::Child,
    data: std::path::PathBuf,
    /// `http://<address>:<port>`.
    pub endpoint: String,
}

impl Etcd {
    /// Starts one named `name` and waits up to 20 s for its health endpoint; `None` where
    /// [`prerequisites`] says to skip (no etcd, or not root). Panics if it does not come up.
    pub fn start(name: &str) -> Option<Etcd> {
        Etcd::start_on(name, std::net::Ipv4Addr::LOCALHOST)
    }

    /// [`Etcd::start`] listening on `ip` (an address of this namespace: a test's own network
    /// when the hosts that use it live in namespaces of their own).
    pub fn start_on(name: &str, ip: std::net::Ipv4Addr) -> Option<Etcd> {
        if !prerequisites(&["etcd"]) {
            return None;
        }
        let free_port = || {
            std::net::TcpListener::bind((ip, 0))
                .and_then(|l| l.local_addr())
                .expect("an ephemeral port")
                .port()
        };
        let (client, peer) = (free_port(), free_port());
        let data = std::env::temp_dir().join(format!(
            "spillway-etcd-{name}-{}-{client}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&data);
        let endpoint = format!("http://{ip}:{client}");
        let peer_url = format!("http://{ip}:{peer}");
        let child = Command::new("etcd")
            .args(["--name", name, "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .args(["--log-level", "warn"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        let etcd = Etcd {
            child,
            data,
            endpoint,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !etcd.healthy(ip, client) {
            assert!(
                std::time::Instant::now() < deadline,
                "etcd at {} not healthy within 20 s",
                etcd.endpoint
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Some(etcd)
    }

    /// Whether its `/health` answers `"health":"true"`.
    fn healthy(&self, ip: std::net::Ipv4Addr, port: u16) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect((ip, port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let mut body = String::new();
        s.write_all(b"GET /health HTTP/1.0\r\nHost: etcd\r\n\r\n")
            .is_ok()
            && s.read_to_string(&mut body).is_ok()
            && body.contains("\"health\":\"true\"")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
