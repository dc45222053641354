//! Allocations per thread, and how a process's loop reports them.
//!
//! A forwarding loop must allocate nothing per frame in steady state. Unit tests prove it for
//! the pieces (the frame nodes, the TAP I/O) with `spillway_testkit::CountingAlloc`; the
//! running processes prove it through the same per-thread counter: the binary's allocator calls
//! [`note`] on every allocation, and each process reports its forwarding thread's count (`ctl
//! status`, the plane's stats), so a test or an operator can compare allocations with frames
//! forwarded. A library user whose allocator does not call [`note`] reads zero.
//!
//! The loop thread also does upkeep (metrics, `ctl`, the plane's process, expiry), which may
//! allocate; [`Upkeep`] counts that apart so the forwarding figure is the data path's alone.

pub use spillway_testkit::{allocations as this_thread, count_allocation as note};

/// A loop thread's allocations split into upkeep and forwarding (everything else).
#[derive(Debug, Default, Clone, Copy)]
pub struct Upkeep {
    /// Allocations made inside upkeep so far.
    upkeep: u64,
    /// The thread's count when the latest upkeep began.
    mark: u64,
}

impl Upkeep {
    /// Upkeep begins; returns the mark to hand to [`Upkeep::end`].
    pub fn begin(&mut self) -> u64 {
        self.mark = this_thread();
        self.mark
    }

    /// The upkeep begun at `mark` is over.
    pub fn end(&mut self, mark: u64) {
        self.upkeep += this_thread() - mark;
    }

    /// Forwarding's allocations up to the start of the latest upkeep: read from inside an
    /// upkeep (a `ctl` answer, a stats report), the report's own allocations are not in it.
    pub fn forwarding(&self) -> u64 {
        self.mark - self.upkeep
    }

    /// Allocations made inside upkeep so far.
    pub fn upkeep(&self) -> u64 {
        self.upkeep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upkeep_allocations_are_counted_apart() {
        let mut u = Upkeep::default();
        let start = this_thread();
        note(); // forwarding
        let m = u.begin();
        note(); // upkeep
        note();
        u.end(m);
        note(); // forwarding
        let m = u.begin();
        // Read inside the upkeep: forwarding so far, the upkeep's own work excluded.
        assert_eq!(u.forwarding() - start, 2);
        assert_eq!(u.upkeep(), 2);
        u.end(m);
        let other = std::thread::spawn(this_thread).join().expect("thread");
        assert_eq!(other, 0, "another thread starts from zero");
    }
}
