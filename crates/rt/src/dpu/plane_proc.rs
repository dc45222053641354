//! The spill plane's process as the DPU process holds it: [`PlaneProc`] (the child, its
//! handshake secret, its vNIC set once connected, its last stats), and how it is stopped or
//! killed. The daemon's methods that start and watch it are in `plane_ctl.rs`.

use std::process::Child;

use crate::shm::vnic::VnicSet;

/// The plane's process as the DPU process sees it.
#[derive(Debug)]
pub(super) struct PlaneProc {
    pub(super) child: Child,
    /// The handshake secret handed to `child` on its stdin.
    pub(super) secret: [u8; crate::shm::vnic::SECRET_LEN],
    pub(super) vnic: Option<VnicSet>,
    pub(super) up: bool,
    pub(super) workers: u32,
    pub(super) stats: serde_json::Value,
}

impl PlaneProc {
    /// Stops the process: SIGTERM first, so the plane exits by itself; killed if it has not
    /// within 500 ms.
    pub(super) fn stop(mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: sending a signal to our own child's pid, which we have not reaped yet
        // (so it cannot have been recycled).
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
    }

    /// Kills and reaps the process at once (it failed: there is nothing to wait for).
    pub(super) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
