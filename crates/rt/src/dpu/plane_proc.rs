//! The spill plane's process as the DPU process holds it: [`PlaneProc`] (the child, its
//! handshake secret, its vNIC set once connected, its last stats), and how it is stopped,
//! retired ([`Retiring`]) or killed. The daemon's methods that start and watch it are in `plane_ctl.rs`.

use std::process::Child;

use crate::shm::vnic::{VnicLane, VnicSet};

/// The plane's process as the DPU process sees it.
#[derive(Debug)]
pub(super) struct PlaneProc {
    /// Its number: the DPU process's plane start count when it was started.
    pub(super) number: u64,
    pub(super) child: Child,
    /// The binary it runs.
    pub(super) exe: std::path::PathBuf,
    /// The handshake secret handed to `child` on its stdin.
    pub(super) secret: [u8; crate::shm::vnic::SECRET_LEN],
    pub(super) vnic: Option<VnicSet>,
    pub(super) up: bool,
    pub(super) workers: u32,
    /// Whether it is the relay to a plane on a pool host.
    pub(super) remote: bool,
    pub(super) stats: serde_json::Value,
}

impl PlaneProc {
    /// Stops the process: SIGTERM first, so the plane exits by itself; killed if it has not
    /// within 500 ms.
    pub(super) fn stop(mut self) {
        crate::host::signals::terminate(&mut self.child, std::time::Duration::from_millis(500));
    }

    /// Fences the process and lets it go without waiting: its vNIC set is closed at once (so
    /// nothing it sends from now on reaches the DPU, even if it is stalled and resumes), it is
    /// asked to exit (SIGTERM) and handed back to be reaped by [`Retiring::reap`], which
    /// kills it if it has not exited within [`RETIRE_GRACE`]. The DPU's loop never waits on
    /// it: a plane retired under load (an upgrade) or fenced while stopped (a stall) costs the
    /// loop one `kill` and one `waitpid` per upkeep.
    pub(super) fn retire(self) -> Retiring {
        let PlaneProc {
            child,
            vnic,
            number,
            ..
        } = self;
        drop(vnic);
        // SAFETY: a signal to our own child's pid, not reaped yet (so not recycled).
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        Retiring {
            child,
            number,
            deadline: std::time::Instant::now() + RETIRE_GRACE,
            ring: None,
            lanes: Vec::new(),
        }
    }

    /// Kills the process (SIGKILL: it failed, or stopped answering, so there is nothing to
    /// wait for) without waiting for it to be gone: a stopped process with its rings mapped
    /// takes milliseconds to exit, which the loop does not wait for. Its vNIC set is kept,
    /// unread, so that what it never took from its phy ring can be taken back once it is
    /// gone ([`Retiring::take_rings`]); so are the forwarding threads' lanes, as they give
    /// them back ([`Retiring::keep_lane`]).
    pub(super) fn kill_async(mut self) -> Retiring {
        let _ = self.child.kill();
        Retiring {
            ring: self.vnic.take(),
            number: self.number,
            child: self.child,
            deadline: std::time::Instant::now() + RETIRE_GRACE,
            lanes: Vec::new(),
        }
    }
}

/// How long a retired plane has to exit after SIGTERM before it is killed. A stalled plane
/// (SIGSTOP) never takes a SIGTERM, so this is also how long a fenced stalled process lives.
pub(super) const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// A plane process asked to exit and not yet reaped.
#[derive(Debug)]
pub(super) struct Retiring {
    child: Child,
    /// Its [`PlaneProc::number`].
    number: u64,
    deadline: std::time::Instant,
    /// A killed plane's vNIC set, to take its ring back from once it is reaped.
    ring: Option<VnicSet>,
    /// The forwarding threads' lanes of a killed plane's vNIC set, given back.
    lanes: Vec<VnicLane>,
}

impl Retiring {
    /// Reaps the process if it has exited; kills it past its deadline. True once it is gone.
    pub(super) fn reap(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(Some(_)) | Err(_) => true,
            Ok(None) if std::time::Instant::now() < self.deadline => false,
            Ok(None) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                true
            }
        }
    }

    /// Every lane of a killed plane's vNIC set (lane 0's, in the set, and those given back),
    /// once [`Retiring::reap`] has found it gone. The set's control socket closes here.
    pub(super) fn take_rings(&mut self) -> Vec<VnicLane> {
        let mut lanes = std::mem::take(&mut self.lanes);
        if let Some(v) = self.ring.take() {
            lanes.push(v.into_lane0());
        }
        lanes
    }

    /// Keeps a forwarding thread's lane of this killed plane until it is reaped.
    pub(super) fn keep_lane(&mut self, lane: VnicLane) {
        self.lanes.push(lane);
    }

    /// Its [`PlaneProc::number`].
    pub(super) fn number(&self) -> u64 {
        self.number
    }

    /// Its pid.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills and reaps it now (at teardown).
    pub(super) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
