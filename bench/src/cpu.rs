//! CPU time accounting for the benchmark tables (CPU seconds per GB moved).
//!
//! Figures come from `getrusage(2)`: user plus system time, in microseconds. A process measures
//! itself (`RUSAGE_SELF`: every thread, the LND's scheduler included) and the children it has
//! waited for (`RUSAGE_CHILDREN`: how `lnd-bench compare` charges the peer tools).

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

#[cfg(test)]
mod tests {
    use super::*;

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
