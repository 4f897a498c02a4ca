//! The machine's copy limit for brw's working set: plain `memcpy` on every core at once, over
//! as many buffers as brw has in flight.
//!
//! A brw run with `concurrency` RPCs of `size` bytes in flight keeps `concurrency` source
//! buffers in the client and as many sinks in the server, and moves every byte with one copy
//! (the software device's same-host path). This measures what the CPUs can copy over a working
//! set of that shape, with nothing else running: one thread per core (at most two, the cores
//! this machine kind has), each copying `size` bytes at a time through its share of the
//! buffer pairs in turn, for the duration. No transport that copies every byte once on these
//! cores can beat it; a peer that beats it copies less (a single buffer that stays in a core's
//! cache, as `ucx_perftest ucp_put_bw` does) or not at all.
//!
//! The buffers are shared memory (a `memfd`, mapped shared), the kind brw's buffers are (the
//! buffer arena, `lnet_shim::arena`), falling back to the heap where a `memfd` cannot be made.
//! On a virtual machine the rate differs from one process to the next, whatever the memory
//! (session 30's host: 33,461–44,218 MiB/s over heap memory, 35,290–49,819 over memfd memory,
//! three `compare` runs each at 1M c8), so compare several runs.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use lnd::clock::Clock;

use crate::cpu;

/// Threads that copy at once: the cores, at most two.
fn copiers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(2)
}

/// What the copy loops achieved together.
#[derive(Clone, Copy, Debug)]
pub struct MemLimit {
    /// Bytes copied per second by all threads, in MiB/s.
    pub mib_s: f64,
    /// CPU seconds per GB (10^9 bytes) of the copying threads.
    pub cpu_s_per_gb: Option<f64>,
    /// Threads that copied.
    pub threads: usize,
    /// Bytes of sources and destinations together.
    pub working_set: usize,
}

/// Copies over `pairs` source/destination pairs of `size` bytes (at least one per thread) on
/// every core for `duration`.
pub fn measure(size: usize, pairs: usize, duration: Duration) -> MemLimit {
    let threads = copiers();
    let pairs = pairs.max(threads);
    let size = size.max(1);
    let per_thread = shares(pairs, threads);
    let results: Vec<(u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> =
            per_thread.iter().map(|&n| s.spawn(move || copy_loop(size, n, duration))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or((0, 0))).collect()
    });
    let bytes: u64 = results.iter().map(|r| r.0).sum();
    let cpu_us: u64 = results.iter().map(|r| r.1).sum();
    let secs = duration.as_secs_f64().max(1e-9);
    MemLimit {
        mib_s: bytes as f64 / f64::from(1 << 20) / secs,
        cpu_s_per_gb: cpu::secs_per_gb(cpu_us, bytes),
        threads,
        working_set: 2 * pairs * size,
    }
}

/// How many of `pairs` buffer pairs each of `threads` copiers owns: thread `t` has pairs `t`,
/// `t + threads`, ... (as many as possible each, never fewer than one pair between them all).
fn shares(pairs: usize, threads: usize) -> Vec<usize> {
    let threads = threads.max(1);
    (0..threads).map(|t| (t..pairs).step_by(threads).count()).collect()
}

/// One thread: `n` pairs of `size`-byte buffers, copied in turn until `duration` has passed.
/// Returns the bytes copied and the thread's CPU time (µs).
fn copy_loop(size: usize, n: usize, duration: Duration) -> (u64, u64) {
    let n = n.max(1);
    let mut memory = Memory::new(2 * n * size);
    let bytes_of = memory.bytes();
    // Touched before the clock starts, as brw's buffers are before a run: written, not zeroed
    // (a new mapping's pages are mapped lazily, on the first copy into them).
    for (i, buf) in bytes_of.chunks_exact_mut(size).enumerate() {
        buf.fill(if i % 2 == 0 { (i / 2) as u8 | 1 } else { 2 });
    }
    let mut pairs: Vec<(&mut [u8], &mut [u8])> = Vec::with_capacity(n);
    let mut rest = bytes_of;
    while let Some((pair, tail)) = rest.split_at_mut_checked(2 * size) {
        let (src, dst) = pair.split_at_mut(size);
        pairs.push((src, dst));
        rest = tail;
    }
    let clock = Clock::new();
    let cpu_before = cpu::used_us(cpu::Who::Thread);
    let start = clock.now();
    let mut bytes = 0u64;
    'run: loop {
        for (src, dst) in &mut pairs {
            dst.copy_from_slice(src);
            std::hint::black_box(&mut *dst);
            bytes += size as u64;
            if clock.now().saturating_duration_since(start) >= duration {
                break 'run;
            }
        }
    }
    (bytes, cpu::used_us(cpu::Who::Thread).saturating_sub(cpu_before))
}

/// A thread's buffers: one shared `memfd` mapping, or heap memory where one cannot be made.
enum Memory {
    Shared { base: *mut u8, len: usize },
    Heap(Vec<u8>),
}

impl Memory {
    /// `len` bytes (at least one), zeroed.
    fn new(len: usize) -> Memory {
        let len = len.max(1);
        Memory::shared(len).unwrap_or_else(|| Memory::Heap(vec![0u8; len]))
    }

    fn shared(len: usize) -> Option<Memory> {
        // SAFETY: a plain system call with a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"lnd-bench-memlimit".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned here alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let size = libc::off_t::try_from(len).ok()?;
        // SAFETY: a plain system call on the fd owned above; the result is checked.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return None;
        }
        // SAFETY: a fresh shared mapping of the whole file at an address the kernel picks;
        // nothing else refers to that range. The result is checked for MAP_FAILED. The
        // mapping keeps the file alive after `fd` is closed.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| Memory::Shared { base: p.cast(), len })
    }

    /// The memory, to carve the buffers from.
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: `base` is a read-write mapping of `len` bytes that lives as long as
            // `self` (unmapped in Drop), owned by `self` alone; the returned borrow of `self`
            // keeps it exclusive. Any bit pattern is a valid `u8`.
            Memory::Shared { base, len } => unsafe { std::slice::from_raw_parts_mut(*base, *len) },
            Memory::Heap(v) => v,
        }
    }

    /// Whether the memory is a shared `memfd` mapping.
    #[cfg(test)]
    fn is_shared(&self) -> bool {
        matches!(self, Memory::Shared { .. })
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Memory::Shared { base, len } = *self {
            // SAFETY: the mapping made in `shared`; no borrow from `bytes` outlives `self`.
            unsafe { libc::munmap(base.cast(), len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_copies_over_the_whole_working_set_on_every_core() {
        let m = measure(64 << 10, 3, Duration::from_millis(50));
        assert!(m.mib_s > 0.0, "{m:?}");
        assert!((1..=2).contains(&m.threads), "{m:?}");
        // At least one pair per thread, and every pair counted: sources and destinations.
        assert_eq!(m.working_set, 2 * 3.max(m.threads) * (64 << 10), "{m:?}");
        assert!(m.cpu_s_per_gb.is_some_and(|c| c > 0.0), "{m:?}");
    }

    #[test]
    fn the_buffers_are_shared_memory_the_kind_brw_uses() {
        let mut m = Memory::new(3 << 20);
        assert!(m.is_shared(), "memfd_create works on Linux");
        let bytes = m.bytes();
        assert_eq!(bytes.len(), 3 << 20);
        assert!(bytes.iter().all(|&b| b == 0), "a new mapping reads as zeros");
        bytes[(3 << 20) - 1] = 7;
        assert_eq!(m.bytes()[(3 << 20) - 1], 7);
    }

    #[test]
    fn the_buffer_pairs_are_shared_out_between_the_threads() {
        assert_eq!(shares(8, 2), vec![4, 4]);
        assert_eq!(shares(3, 2), vec![2, 1]);
        assert_eq!(shares(8, 1), vec![8]);
        assert_eq!(shares(1, 0), vec![1]);
    }
}
