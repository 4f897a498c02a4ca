//! CPU time accounting for the benchmark tables (CPU seconds per GB moved).
//!
//! Figures come from `getrusage(2)`: user plus system time, in microseconds. A process measures
//! itself (`RUSAGE_SELF`: every thread, the LND's scheduler included) and the children it has
//! waited for (`RUSAGE_CHILDREN`: how `lnd-bench compare` charges the peer tools).
//!
//! On a virtual machine the hypervisor may run other guests on this one's CPUs: the guest
//! kernel counts that time as *steal* (`/proc/stat`), and it slows every figure measured
//! meanwhile, ours and the peers' alike, by different amounts at different moments.
//! [`HostTimes`] samples the machine-wide account so `compare` can say how much of each part
//! of its run was stolen.

/// Which `getrusage` account to read.
#[derive(Clone, Copy, Debug)]
pub enum Who {
    /// This process, all threads.
    Process,
    /// This process's terminated and waited-for children.
    Children,
    /// The calling thread.
    Thread,
}

/// User plus system CPU time of `who`, in microseconds (0 if the call fails).
pub fn used_us(who: Who) -> u64 {
    let which = match who {
        Who::Process => libc::RUSAGE_SELF,
        Who::Children => libc::RUSAGE_CHILDREN,
        Who::Thread => libc::RUSAGE_THREAD,
    };
    // SAFETY: `rusage` is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage(2) writes one `rusage` through the valid pointer we pass.
    if unsafe { libc::getrusage(which, &mut ru) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

/// CPU seconds per 10^9 bytes, or `None` when nothing moved.
pub fn secs_per_gb(cpu_us: u64, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| cpu_us as f64 / 1e6 / (bytes as f64 / 1e9))
}

/// The machine-wide CPU account of `/proc/stat` (its `cpu` line), in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostTimes {
    /// Ticks the hypervisor gave to others while this machine's CPUs wanted to run.
    pub steal: u64,
    /// All ticks: user, nice, system, idle, iowait, irq, softirq and steal (guest time is
    /// already inside user and nice).
    pub total: u64,
}

impl HostTimes {
    /// Reads `/proc/stat` now; `None` where it is missing or unreadable (not Linux).
    pub fn now() -> Option<HostTimes> {
        HostTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The `cpu` line of a `/proc/stat` text; `None` if it is missing or malformed. Kernels
    /// before 2.6.11 have no steal field: a line with seven values has steal 0.
    pub fn parse(stat: &str) -> Option<HostTimes> {
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some("cpu"))?;
        let mut values = Vec::with_capacity(8);
        for field in line.split_whitespace().skip(1).take(8) {
            values.push(field.parse::<u64>().ok()?);
        }
        if values.len() < 7 {
            return None;
        }
        let steal = values.get(7).copied().unwrap_or(0);
        let total = values.iter().try_fold(0u64, |sum, &v| sum.checked_add(v))?;
        Some(HostTimes { steal, total })
    }

    /// The share of the machine's CPU time stolen since `start` (a sample taken earlier with
    /// [`HostTimes::now`]); `None` if either sample is missing.
    pub fn stolen_since(start: Option<HostTimes>) -> Option<f64> {
        start.zip(HostTimes::now()).and_then(|(a, b)| a.steal_since(b))
    }

    /// The share of the machine's CPU time stolen between `self` and the later `after`
    /// (0.0 to 1.0); `None` if no tick passed or the counters went backwards.
    pub fn steal_since(self, after: HostTimes) -> Option<f64> {
        let total = after.total.checked_sub(self.total).filter(|&t| t > 0)?;
        let steal = after.steal.checked_sub(self.steal)?;
        Some((steal as f64 / total as f64).min(1.0))
    }
}

/// `steal` as the text of `compare`'s host lines: "12.3%", or "unknown".
pub fn steal_text(steal: Option<f64>) -> String {
    steal.map_or_else(|| "unknown".to_owned(), |s| format!("{:.1}%", 100.0 * s))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  1531681 0 187741 12217044 4237 0 10186 70973 0 0\n\
                        cpu0 760837 0 95292 6111780 2615 0 4548 35501 0 0\n\
                        intr 1 2 3\n";

    #[test]
    fn host_times_read_the_cpu_line() {
        let t = HostTimes::parse(STAT).expect("parses");
        assert_eq!(t.steal, 70973);
        assert_eq!(t.total, 1531681 + 187741 + 12217044 + 4237 + 10186 + 70973);
        // Seven values (a kernel without steal accounting): steal 0.
        assert_eq!(HostTimes::parse("cpu 1 2 3 4 5 6 7\n"), Some(HostTimes { steal: 0, total: 28 }));
    }

    #[test]
    fn host_times_refuse_malformed_text() {
        for bad in
            ["", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 x 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu -1 2 3 4 5 6 7 8\n"]
        {
            assert_eq!(HostTimes::parse(bad), None, "{bad:?}");
        }
        let huge = format!("cpu {} {} 0 0 0 0 0 0\n", u64::MAX, u64::MAX);
        assert_eq!(HostTimes::parse(&huge), None, "the sum overflows");
    }

    #[test]
    fn steal_is_the_stolen_share_of_the_ticks_between_samples() {
        let a = HostTimes { steal: 100, total: 1000 };
        let b = HostTimes { steal: 130, total: 1100 };
        assert_eq!(a.steal_since(b), Some(0.3));
        assert_eq!(a.steal_since(a), None, "no tick passed");
        assert_eq!(b.steal_since(a), None, "counters went backwards");
        assert_eq!(steal_text(Some(0.123)), "12.3%");
        assert_eq!(steal_text(None), "unknown");
        // This machine's own account, where there is one (Linux), is consistent.
        if let Some(now) = HostTimes::now() {
            assert!(now.steal <= now.total);
        }
        assert_eq!(HostTimes::stolen_since(None), None);
    }

    #[test]
    fn a_busy_thread_is_charged_cpu_time() {
        let before = used_us(Who::Thread);
        let mut x = 0u64;
        let mut i = 0u64;
        // Spin until the clock moves by at least a millisecond (bounded by the loop itself:
        // getrusage advances with the work done).
        while used_us(Who::Thread) < before + 1_000 && i < 1 << 34 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
            i += 1;
        }
        std::hint::black_box(x);
        assert!(used_us(Who::Thread) >= before + 1_000);
        assert!(used_us(Who::Process) >= used_us(Who::Thread));
    }

    #[test]
    fn cpu_per_gb_scales_with_bytes() {
        assert_eq!(secs_per_gb(2_000_000, 1_000_000_000), Some(2.0));
        assert_eq!(secs_per_gb(1_000_000, 4_000_000_000), Some(0.25));
        assert_eq!(secs_per_gb(5, 0), None);
    }
}
