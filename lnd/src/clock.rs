//! The one place that reads the operating system's clocks.
//!
//! The protocol core takes `now` as an argument; drivers, tools and process-level tests get it
//! from a [`Clock`]. Wall-clock time is read only for incarnation stamps.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::time::Instant;

/// A monotonic clock whose epoch is its creation.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    base: std::time::Instant,
}

impl Clock {
    /// A clock starting now.
    #[allow(clippy::disallowed_methods, reason = "the driver clock is the one reader of the OS clock")]
    pub fn new() -> Clock {
        Clock { base: std::time::Instant::now() }
    }

    /// The current time.
    #[allow(clippy::disallowed_methods, reason = "the driver clock is the one reader of the OS clock")]
    pub fn now(&self) -> Instant {
        let d = std::time::Instant::now().saturating_duration_since(self.base);
        Instant::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Converts a protocol `Instant` back to a `std::time::Instant` (for `Poll` timeouts).
    pub fn to_std(&self, t: Instant) -> std::time::Instant {
        self.base + std::time::Duration::from_nanos(t.as_nanos())
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::new()
    }
}

/// Microseconds since the Unix epoch: o2iblnd's incarnation stamp (wall-clock at NI startup).
#[allow(clippy::disallowed_methods, reason = "incarnation stamps are wall-clock by definition")]
pub fn wall_clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
