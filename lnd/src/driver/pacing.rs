//! How often a spinning scheduler makes its two system calls.
//!
//! A spinning scheduler reads its frame rings, polled CQs and command queue from memory. Two
//! things need the kernel: its poller (`epoll_wait`: sockets, the waker, completion channels)
//! and handing the CPU to another runnable thread (`sched_yield`). Each takes from 0.15 µs to
//! well over a microsecond depending on the host (an EPYC KVM guest: `epoll_wait` with no
//! timeout 0.5 µs, `sched_yield` 1.3 µs, with nothing else runnable), and a frame that lands
//! meanwhile waits for it. Asked every 5 µs, as before this module, they kept the scheduler
//! deaf a quarter of the time there. [`SpinPacing`] asks each only as often as it is useful:
//!
//! * **The poller** every [`POLL_INTERVAL`] while the device moves packets through its fds
//!   ([`crate::fabric::Device::fd_packets`]: the software device's UDP socket), or cannot
//!   tell, or the last poll reported one of them; once none has for [`FD_QUIET`] (every peer
//!   behind a same-host ring), every [`QUIET_POLL_INTERVAL`]: a first frame from a new remote
//!   peer then waits at most that long, once.
//! * **A yield** every [`YIELD_MIN`] while yields hand the CPU over: one that took
//!   [`YIELD_RAN`] or longer let another thread run (a copy helper sharing this core, the peer
//!   process on a machine with one core). After each yield that came straight back (nobody was
//!   waiting), the interval doubles, up to [`YIELD_MAX`]; a yield that lets someone run brings
//!   it back down at once.
//!
//! The pacing is a plain state machine: time comes in as `now`, and the scheduler reports what
//! it did ([`SpinPacing::yielded`], [`SpinPacing::polled`]).

use std::time::Duration;

use crate::time::Instant;

/// The poller's interval while packets move through the device's fds. Measured with ping 8 B
/// over UDP: 2 µs gave 8.8–9.8 µs round trips, 5 µs 8.2–8.3, 10 µs 8.0 (with a worse p99).
pub const POLL_INTERVAL: Duration = Duration::from_micros(5);
/// The poller's interval once the fds have been quiet for [`FD_QUIET`].
pub const QUIET_POLL_INTERVAL: Duration = Duration::from_micros(200);
/// How long without a packet through the device's fds makes them quiet.
pub const FD_QUIET: Duration = Duration::from_millis(10);
/// The shortest interval between yields (while yields let other threads run).
pub const YIELD_MIN: Duration = Duration::from_micros(5);
/// The longest interval between yields (while nobody is waiting for the CPU).
pub const YIELD_MAX: Duration = Duration::from_micros(200);
/// A yield that took this long let another thread run.
pub const YIELD_RAN: Duration = Duration::from_micros(4);

/// When a spinning scheduler next polls and yields.
#[derive(Clone, Debug)]
pub struct SpinPacing {
    last_poll: Instant,
    /// The device's fd packet count at the last poll (`None`: it cannot tell).
    fd_packets: Option<u64>,
    /// When the device's fds last moved a packet (or a poll reported one of them).
    fd_active: Instant,
    last_yield: Instant,
    yield_interval: Duration,
}

impl SpinPacing {
    /// Pacing that starts with both system calls at their shortest interval.
    pub fn new(now: Instant) -> SpinPacing {
        SpinPacing {
            last_poll: now,
            fd_packets: None,
            fd_active: now,
            last_yield: now,
            yield_interval: YIELD_MIN,
        }
    }

    /// Whether the poller is due.
    pub fn poll_due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_poll) >= self.poll_interval()
    }

    /// Whether a yield is due (to a scheduler that is spinning).
    pub fn yield_due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_yield) >= self.yield_interval
    }

    /// The earliest moment either is due: how long a spin on memory alone may last.
    pub fn next_due(&self) -> Instant {
        (self.last_poll + self.poll_interval()).min(self.last_yield + self.yield_interval)
    }

    /// The scheduler yielded the CPU from `start` to `end`.
    pub fn yielded(&mut self, start: Instant, end: Instant) {
        self.last_yield = end;
        self.yield_interval = if end.saturating_duration_since(start) >= YIELD_RAN {
            YIELD_MIN
        } else {
            (self.yield_interval * 2).min(YIELD_MAX)
        };
    }

    /// The scheduler polled at `now`; `fd_events`: the poll reported one of the device's fds;
    /// `fd_packets`: the device's count of packets through its fds, if it keeps one.
    pub fn polled(&mut self, now: Instant, fd_events: bool, fd_packets: Option<u64>) {
        self.last_poll = now;
        let moved = match (self.fd_packets, fd_packets) {
            (_, None) => true,
            (Some(before), Some(after)) => before != after,
            (None, Some(_)) => false,
        };
        self.fd_packets = fd_packets;
        if moved || fd_events {
            self.fd_active = now;
        }
    }

    /// The poller's current interval: short unless the fds had been quiet for [`FD_QUIET`]
    /// at the last poll.
    pub fn poll_interval(&self) -> Duration {
        if self.last_poll.saturating_duration_since(self.fd_active) < FD_QUIET {
            POLL_INTERVAL
        } else {
            QUIET_POLL_INTERVAL
        }
    }

    /// The current interval between yields.
    pub fn yield_interval(&self) -> Duration {
        self.yield_interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(us: u64) -> Instant {
        Instant::from_micros(us)
    }

    #[test]
    fn yields_back_off_while_nobody_waits_and_return_when_someone_runs() {
        let mut p = SpinPacing::new(at(0));
        assert!(!p.yield_due(at(4)));
        assert!(p.yield_due(at(5)));
        let mut t = 5;
        let mut intervals = Vec::new();
        for _ in 0..8 {
            // A yield that came straight back (1 µs).
            p.yielded(at(t), at(t + 1));
            intervals.push(p.yield_interval().as_micros());
            t += 1 + u64::try_from(p.yield_interval().as_micros()).unwrap_or(0);
            assert!(p.yield_due(at(t)));
        }
        assert_eq!(intervals, [10, 20, 40, 80, 160, 200, 200, 200]);
        // Another thread ran during this one: back to the shortest interval.
        p.yielded(at(t), at(t + 30));
        assert_eq!(p.yield_interval(), YIELD_MIN);
        assert!(!p.yield_due(at(t + 34)));
        assert!(p.yield_due(at(t + 35)));
    }

    #[test]
    fn the_poller_slows_only_once_the_fds_are_quiet() {
        let mut p = SpinPacing::new(at(0));
        // Packets through the fds: the short interval.
        p.polled(at(5), false, Some(1));
        p.polled(at(10), false, Some(2));
        assert_eq!(p.poll_interval(), POLL_INTERVAL);
        // Nothing moves, but for less than FD_QUIET: still short.
        p.polled(at(9_000), false, Some(2));
        assert_eq!(p.poll_interval(), POLL_INTERVAL);
        assert!(p.poll_due(at(9_005)));
        // Quiet for FD_QUIET: the long interval.
        p.polled(at(10_010), false, Some(2));
        assert_eq!(p.poll_interval(), QUIET_POLL_INTERVAL);
        assert!(!p.poll_due(at(10_100)));
        assert!(p.poll_due(at(10_210)));
        // The poll reports the socket readable (a new peer's first frame): short again, even
        // before the count moves.
        p.polled(at(10_210), true, Some(2));
        assert_eq!(p.poll_interval(), POLL_INTERVAL);
        // And a count that moves keeps it short.
        p.polled(at(25_000), false, Some(3));
        assert_eq!(p.poll_interval(), POLL_INTERVAL);
    }

    #[test]
    fn a_device_that_cannot_count_keeps_the_short_interval() {
        let mut p = SpinPacing::new(at(0));
        for t in [5, 50_000, 100_000] {
            p.polled(at(t), false, None);
            assert_eq!(p.poll_interval(), POLL_INTERVAL);
        }
    }

    #[test]
    fn next_due_is_the_earlier_of_the_two() {
        let mut p = SpinPacing::new(at(0));
        assert_eq!(p.next_due(), at(5));
        p.yielded(at(5), at(6));
        p.polled(at(6), false, Some(0));
        // Yield due at 6 + 10, poll at 6 + 5.
        assert_eq!(p.next_due(), at(11));
        p.polled(at(20_000), false, Some(0));
        // Poll quiet (20_000 + 200), yield long overdue.
        assert_eq!(p.next_due(), at(16));
    }
}
