//! Time as the core sees it: an [`Instant`] handed in by the driver.
//!
//! The core never reads a clock. The simulator passes virtual time, the real-time driver passes a
//! monotonic clock reading; both are nanoseconds since an origin the driver chooses.

use core::fmt;
use core::ops::{Add, Sub};
use core::time::Duration;

/// A point in time: nanoseconds since the driver's origin.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct Instant(pub u64);

impl Instant {
    /// The driver's origin.
    pub const ZERO: Instant = Instant(0);

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        // Saturate rather than wrap: u64 nanoseconds last 584 years, so saturation only happens
        // for "never" deadlines built from Duration::MAX.
        Instant(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{:09}s",
            self.0 / 1_000_000_000,
            self.0 % 1_000_000_000
        )
    }
}
