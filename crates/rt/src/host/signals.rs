//! SIGINT / SIGTERM as a flag the driver loops poll, so Ctrl-C runs the same orderly teardown
//! as a normal exit (the testbed's namespaces, the plane's process and cgroup are removed).

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe work here: two atomic stores.
    SIGNAL.store(sig, Ordering::Relaxed);
    STOP.store(true, Ordering::Release);
}

/// Installs the handler for SIGINT and SIGTERM (and ignores SIGPIPE, so a peer that went away
/// is an `EPIPE` error on the write, not the death of the process).
pub fn install() -> std::io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `sigaction` with a zeroed struct, an empty mask and a handler that only
        // performs atomic stores (async-signal-safe); the struct outlives the call.
        let rc = unsafe {
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, core::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: setting SIGPIPE's disposition to ignore has no memory-safety preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    Ok(())
}

/// Whether a stop was requested.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Acquire)
}

/// The signal that requested the stop, if one did.
pub fn stop_signal() -> Option<i32> {
    match SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// Requests a stop from inside the process (an operator command, a fatal error).
pub fn request_stop() {
    STOP.store(true, Ordering::Release);
}

/// Stops child `child`: SIGTERM first, so it exits by itself; killed if it has not within
/// `grace`; reaped either way.
pub fn terminate(child: &mut std::process::Child, grace: std::time::Duration) {
    // SAFETY: kill(2) with our own child's pid, not yet reaped (so not recycled); no memory
    // is involved.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
}
