//! Allocations per thread, counted by the binary's global allocator.
//!
//! A forwarding loop must allocate nothing per frame in steady state. Unit tests prove it for
//! the pieces (the frame nodes, the TAP I/O) with a counting allocator of their own; this
//! counter proves it for the running daemon: the binary's allocator calls [`note`] on every
//! allocation, and the DPU process reports the count of its forwarding thread (`ctl status`,
//! the metrics endpoint), so a test or an operator can compare allocations with frames
//! forwarded. A library user whose allocator does not call [`note`] reads zero.
//!
//! The counter is a `const`-initialised thread-local `Cell` with no destructor: reading and
//! bumping it never allocates and is safe from inside an allocator, also while a thread exits.

use std::cell::Cell;

thread_local! {
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// Counts one allocation on the calling thread. Called by a global allocator.
#[inline]
pub fn note() {
    // `try_with`: during thread teardown the slot may be gone; then the allocation is not
    // counted rather than aborting inside the allocator.
    let _ = COUNT.try_with(|c| c.set(c.get().wrapping_add(1)));
}

/// Allocations counted on the calling thread so far.
pub fn this_thread() -> u64 {
    COUNT.try_with(Cell::get).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_thread() {
        let before = this_thread();
        note();
        note();
        assert_eq!(this_thread() - before, 2);
        let other = std::thread::spawn(|| {
            note();
            this_thread()
        })
        .join()
        .expect("thread");
        assert_eq!(other, 1, "another thread starts from zero");
        assert_eq!(this_thread() - before, 2, "and does not count here");
    }
}
