//! The real-time driver's clock: `CLOCK_MONOTONIC` nanoseconds since a shared origin, as the
//! fabric core's [`Instant`]. The DPU process picks the origin and hands it to the plane, so a
//! train's `born` stamp means the same moment in both processes and latency can be measured
//! across them.

use spillway_vswitch::Instant;

/// `CLOCK_MONOTONIC` in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// A clock that reads [`Instant`]s from an origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    origin_ns: u64,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn start() -> Clock {
        // Start one second in, so `Instant::ZERO` is strictly in the past and timers the core
        // sets relative to zero are due at once rather than ambiguous.
        Clock {
            origin_ns: monotonic_ns().saturating_sub(1_000_000_000),
        }
    }

    /// A clock with the given origin (the peer's).
    pub fn with_origin(origin_ns: u64) -> Clock {
        Clock { origin_ns }
    }

    /// The origin, in `CLOCK_MONOTONIC` nanoseconds.
    pub fn origin_ns(&self) -> u64 {
        self.origin_ns
    }

    /// Now.
    pub fn now(&self) -> Instant {
        Instant(monotonic_ns().saturating_sub(self.origin_ns))
    }
}
