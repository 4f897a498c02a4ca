//! The machine's floor under any same-host round trip: two processes bouncing one cache line
//! each way through shared memory, with nothing else on the path (no ring, no headers, no
//! copies, no completion queue).
//!
//! `lnd-bench line-ping` maps one page of a `memfd` and starts this executable as
//! `line-pong`, with the `memfd` as its standard input. The pinger writes a sequence number
//! into its line and spins until the ponger's line holds the same number; the ponger spins on
//! the pinger's line and copies each new number into its own. The two lines are 128 bytes
//! apart, so neither adjacent-line prefetching nor false sharing joins them. A round trip is
//! therefore two cache-line transfers between cores, the least that any message going there
//! and back between two processes costs: `compare` sets UCX's `sm` ping, the software device's
//! (`fabric-ping`) and ours against it.
//!
//! Timing each round trip would add a clock read to every one, so the pinger times batches of
//! [`BATCH`] and reports the median (and 99th percentile) of the batches' means. Every wait is
//! bounded: the pinger gives up if an answer takes longer than [`ANSWER_TIMEOUT`], and the
//! ponger leaves when told to, when its parent is gone, or at its deadline.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use lnd::clock::Clock;
use lnd::time::Instant;

/// Round trips per timed batch.
pub const BATCH: u64 = 64;
/// The longest the pinger waits for one answer (or the ponger for its first ping).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The mapping: one page.
const PAGE: usize = 4096;
/// Word offsets (8-byte words) of the two lines in the page: 128 bytes apart.
const PING_WORD: usize = 0;
const PONG_WORD: usize = 16;
/// What the ponger writes once it is mapped and waiting.
const READY: u64 = u64::MAX - 1;
/// What the pinger writes when it is done.
const STOP: u64 = u64::MAX;
/// Spins between looks at the clock (and, when waiting that long, yields of the CPU: on an
/// oversubscribed machine the other side may need it to answer at all).
const SPINS_PER_LOOK: u32 = 1 << 12;

/// What a line ping measured.
#[derive(Clone, Copy, Debug)]
pub struct LineResult {
    /// Round trips completed (each answered with its own sequence number).
    pub round_trips: u64,
    /// Median round trip (of the batches' means), µs.
    pub p50_us: f64,
    /// 99th percentile round trip (of the batches' means), µs.
    pub p99_us: f64,
}

/// One shared page, mapped read-write.
struct Page {
    base: *mut AtomicU64,
}

impl Page {
    fn map(fd: &OwnedFd) -> Result<Page, String> {
        // SAFETY: a fresh shared mapping of one page of `fd` at an address the kernel picks;
        // nothing else in this process refers to that range. The result is checked for
        // MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("cannot map the shared page: {}", std::io::Error::last_os_error()));
        }
        Ok(Page { base: p.cast() })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < PAGE / 8);
        // SAFETY: `base` is a page-aligned mapping of PAGE bytes that lives as long as `self`
        // (unmapped in Drop), so word `i` is in bounds and 8-byte aligned; an AtomicU64 is
        // valid for any bit pattern, and both processes touch the page only atomically.
        unsafe { &*self.base.add(i) }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: `base` is the start of the PAGE-byte mapping made in `map`, and no reference
        // from `word` outlives `self`.
        unsafe { libc::munmap(self.base.cast(), PAGE) };
    }
}

/// Waits until `word` holds something other than `old`, and returns it; `None` at `deadline`
/// or when `give_up` says so (checked with the clock, every [`SPINS_PER_LOOK`] spins).
fn wait_change(
    word: &AtomicU64,
    old: u64,
    clock: &Clock,
    deadline: Instant,
    give_up: impl Fn() -> bool,
) -> Option<u64> {
    loop {
        for _ in 0..SPINS_PER_LOOK {
            let v = word.load(Ordering::Acquire);
            if v != old {
                return Some(v);
            }
            std::hint::spin_loop();
        }
        if clock.now() >= deadline || give_up() {
            return None;
        }
        std::thread::yield_now();
    }
}

/// Pings a `line-pong` child of this executable for `duration`.
pub fn measure(duration: Duration) -> Result<LineResult, String> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; a negative return is an
    // error, checked before the fd is used.
    let raw = unsafe { libc::memfd_create(c"lnd-bench-line".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` was just returned by memfd_create and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on an fd this function owns; the return value is checked.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), PAGE as libc::off_t) } != 0 {
        return Err(format!("ftruncate: {}", std::io::Error::last_os_error()));
    }
    let page = Page::map(&fd)?;
    let seconds = duration.as_secs_f64() + ANSWER_TIMEOUT.as_secs_f64();
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let child_fd = fd.try_clone().map_err(|e| format!("cannot pass the shared page on: {e}"))?;
    let mut child = Command::new(exe)
        .args(["line-pong", "--seconds", &format!("{seconds:.3}")])
        .stdin(Stdio::from(child_fd))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the line pong: {e}"))?;
    let result = ping(&page, duration);
    page.word(PING_WORD).store(STOP, Ordering::Release);
    let _ = child.wait();
    result
}

fn ping(page: &Page, duration: Duration) -> Result<LineResult, String> {
    let (ping, pong) = (page.word(PING_WORD), page.word(PONG_WORD));
    let clock = Clock::new();
    let started = clock.now();
    if wait_change(pong, 0, &clock, started + ANSWER_TIMEOUT, || false) != Some(READY) {
        return Err("the line pong did not start".to_owned());
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    let warmup = 1000 / BATCH;
    let (mut seq, mut batches) = (0u64, 0u64);
    let mut round_trips = 0u64;
    let end = clock.now() + duration;
    loop {
        let t0 = clock.now();
        if t0 >= end && batches > warmup {
            break;
        }
        let give_up = t0 + ANSWER_TIMEOUT;
        for _ in 0..BATCH {
            let last = if seq == 0 { READY } else { seq };
            seq += 1;
            ping.store(seq, Ordering::Release);
            let answer = wait_change(pong, last, &clock, give_up, || false);
            match answer {
                Some(v) if v == seq => {}
                Some(v) => return Err(format!("ping {seq} was answered with {v}")),
                None => return Err(format!("ping {seq} was not answered within {ANSWER_TIMEOUT:?}")),
            }
        }
        let ns = clock.now().saturating_duration_since(t0).as_nanos() / u128::from(BATCH);
        batches += 1;
        if batches > warmup {
            round_trips += BATCH;
            let _ = latency.record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
        }
    }
    Ok(LineResult {
        round_trips,
        p50_us: latency.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: latency.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

/// The ponger: maps the page on standard input and echoes every ping until told to stop, its
/// parent goes, or `seconds` pass.
pub fn pong(seconds: f64) -> Result<(), String> {
    // SAFETY: fd 0 is this process's standard input, which `measure` made the memfd; the
    // OwnedFd takes it over for the rest of the process (nothing else reads stdin here).
    let fd = unsafe { OwnedFd::from_raw_fd(0) };
    let page = Page::map(&fd)?;
    let (ping, pong) = (page.word(PING_WORD), page.word(PONG_WORD));
    let clock = Clock::new();
    let deadline = clock.now() + Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0));
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    // SAFETY: as above.
    let orphaned = || unsafe { libc::getppid() } != parent;
    pong.store(READY, Ordering::Release);
    let mut last = 0u64;
    loop {
        match wait_change(ping, last, &clock, deadline, orphaned) {
            Some(STOP) => return Ok(()),
            Some(v) => {
                last = v;
                pong.store(v, Ordering::Release);
            }
            None if orphaned() => return Err("line-pong: the pinger is gone".to_owned()),
            None => return Err(format!("line-pong: not told to stop within {seconds} s")),
        }
    }
}
