//! Large same-host copies on two cores: a copy engine for the placement path.
//!
//! A placed RDMA WRITE is one `memcpy` from the requester's mapped arena into the responder's
//! registered memory, made by the responder's scheduler thread (under the device lock, before
//! the WRITE is acknowledged). For large WRITEs that copy is most of that thread's work, while
//! another core may have time to spare. A `Copier` is the device's copy engine: one helper
//! thread, started on first use, that shares every copy of at least [`SPLIT_MIN`] bytes. The
//! copy is cut into [`CHUNK`]-byte chunks; the helper claims them one by one from the front,
//! the caller from the back, until the two meet, so the work divides itself by how much time
//! each has, and each thread copies the same part of every buffer copy after copy (`End`).
//!
//! Two contracts:
//! * **`Copier::copy`** (the tests') is a plain synchronous copy: it returns when every byte
//!   is in place, so the lifetime of the memory involved is exactly that of a `memcpy` on the
//!   calling thread; `Copier::start` of a copy that does not run is the same. The helper
//!   never holds the caller up for long: it joins a job only by claiming it while it is still
//!   open, and a job it has not joined by the time the caller has claimed every chunk is
//!   closed and finished by the caller alone. Once joined, the caller waits only for the
//!   chunk the helper is copying.
//! * **`Copier::start`** may leave a copy of at least [`ASYNC_MIN`] bytes *running* on the
//!   helper, the way an HCA's DMA engine runs while the CPU goes on: the caller returns at
//!   once and later finishes it (`Copier::finish`: it claims what the helper has not taken
//!   and waits for the helper's chunk, or returns at once when the helper is through; or
//!   `Copier::is_done`, a look). The caller keeps the memory valid until then; the device
//!   does so by finishing the running copy before anything that could end that validity (see
//!   [`super::place`]). A copy runs only while the helper is looking for work (awake, it
//!   takes it within microseconds); otherwise it is copied as `copy` copies it, shared with
//!   the helper, whose post wakes a parked helper for the copies after it. At most one copy
//!   runs at a time. Whether the helper is looking is the OS scheduler's doing, so a device
//!   on a virtual clock (whose runs a seed replays) uses `Copier::timing_free`: there only
//!   `Always` leaves copies running, every large one.
//!
//! Whether a large copy uses ordinary or streaming stores is the device's [`Streaming`]
//! choice ([`super::streaming`]), made once per copy and followed by both threads.
//!
//! Idle costs nothing: after a job the helper looks for the next for a while (the device's
//! `SoftConfig::helper_spin`, which the driver sets to `busy_poll_usec`), yielding the CPU,
//! then parks until the next large copy unparks it.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use super::streaming::{self, Footprint, STREAM_MIN, Streaming};
use crate::clock::Clock;

/// Copies smaller than this stay on the calling thread (waking the helper costs more).
pub const SPLIT_MIN: usize = 256 << 10;
/// The unit of work the caller and the helper claim.
pub const CHUNK: usize = 64 << 10;
/// Copies smaller than this never run on the helper alone (`Copier::start`). Not below
/// [`SPLIT_MIN`]: a copy the helper is not looking for is then shared with it, and the unpark
/// that posts it wakes a parked helper for the copies after it.
pub const ASYNC_MIN: usize = SPLIT_MIN;
/// The most chunks a shared copy may have (a claims word counts them in 32 bits).
const MAX_CHUNKS: usize = u32::MAX as usize;
/// While it looks, how often the helper yields the CPU.
const YIELD_EVERY: Duration = Duration::from_micros(5);

const IDLE: u8 = 0;
const POSTED: u8 = 1;
const TAKEN: u8 = 2;
const DONE: u8 = 3;

/// Whether and how a device splits large copies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyHelper {
    /// Every copy on the responder's thread.
    Off,
    /// Large copies shared with the helper thread as far as it has time (the default, on
    /// machines with more than one CPU).
    #[default]
    Auto,
    /// Every large copy made by the helper, the caller waiting for it even when copying
    /// alone would be quicker: for tests of the helper's path, which must not depend on how
    /// the OS schedules the helper.
    Always,
}

impl CopyHelper {
    /// `Auto` on a machine with more than one CPU, else `Off`.
    pub fn for_this_machine() -> CopyHelper {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
            CopyHelper::Auto
        } else {
            CopyHelper::Off
        }
    }

    /// The mode a value of `LND_SOFT_COPY_HELPER` asks for: `off`/`0`/`false`, `always`, or
    /// (unset, empty, `auto`, `on`, `1`, `true`) [`CopyHelper::for_this_machine`]; `None` for
    /// a value that names no mode.
    pub fn parse(value: Option<&str>) -> Option<CopyHelper> {
        match value.map(str::trim) {
            None | Some("" | "1" | "on" | "true" | "auto") => Some(CopyHelper::for_this_machine()),
            Some("0" | "off" | "false") => Some(CopyHelper::Off),
            Some("always") => Some(CopyHelper::Always),
            Some(_) => None,
        }
    }

    /// The default: `LND_SOFT_COPY_HELPER`, else [`CopyHelper::for_this_machine`]. With
    /// `always`, whole suites run with every large same-host copy left running on the helper
    /// (CI runs the engine simulations so). A value that names no mode is reported once on
    /// stderr and means the machine's default.
    pub fn from_env() -> CopyHelper {
        super::setting_from_env(
            "LND_SOFT_COPY_HELPER",
            CopyHelper::parse,
            "auto, off or always",
            CopyHelper::for_this_machine,
        )
    }
}

/// One contiguous piece of a copy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) src: *const u8,
    pub(crate) dst: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: a `Seg` is only dereferenced while its copy is posted or running (by the caller or
// the helper), for which long `Copier::copy`'s and `Copier::start`'s callers guarantee the
// memory.
unsafe impl Send for Seg {}

impl Seg {
    /// Copies the piece, with streaming stores if `stream`.
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `len` bytes, not overlapping.
    unsafe fn run(self, stream: bool) {
        if stream {
            // SAFETY: the caller's promise.
            unsafe { streaming::stream_copy(self.src, self.dst, self.len) };
        } else {
            // SAFETY: the caller's promise.
            unsafe { std::ptr::copy_nonoverlapping(self.src, self.dst, self.len) };
        }
    }
}

#[derive(Debug)]
struct Shared {
    /// IDLE, POSTED (open for the helper to join), TAKEN (joined), DONE (the helper is out).
    state: AtomicU8,
    /// The posted job's pieces.
    job: Mutex<Vec<Seg>>,
    /// The chunks of the posted job not yet claimed ([`Claims`]).
    claims: AtomicU64,
    /// Whether the posted job streams (written before it is posted).
    stream: AtomicBool,
    stop: AtomicBool,
    /// Jobs the helper copied a chunk of.
    helped: AtomicU64,
    /// The helper is awake, looking for a job (it joins a posted one within microseconds).
    looking: AtomicBool,
}

/// What [`Copier::start`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Started {
    /// Every byte is in place.
    Done,
    /// The copy runs on the helper: see [`Copier::is_done`] and [`Copier::finish`].
    Running,
}

/// A device's copy engine (see the module notes).
#[derive(Debug)]
pub(crate) struct Copier {
    shared: Arc<Shared>,
    helper: Option<(Thread, JoinHandle<()>)>,
    mode: CopyHelper,
    /// How long the idle helper looks for the next job before it parks.
    spin: Duration,
    streaming: Streaming,
    /// `Auto` streams while the footprint is above this many bytes.
    budget: usize,
    footprint: Footprint,
    /// Copies made with streaming stores.
    streamed: u64,
    /// The posted or running copy: its pieces and store kind.
    running: Option<Running>,
    /// The pieces' vector of the last copy, kept for the next (no allocation per copy).
    spare: Vec<Seg>,
    /// Copies [`Copier::start`] left running.
    started_running: u64,
    /// In `Auto`, whether `start` may leave a copy running (`Copier::timing_free` clears it).
    run_when_looking: bool,
}

#[derive(Debug)]
struct Running {
    segs: Vec<Seg>,
    stream: bool,
}

impl Copier {
    /// A copy engine working in `mode`, whose idle helper looks for work for `spin` before
    /// it parks, and whose large copies stream as `streaming` says (`Auto`: once the recent
    /// destinations add up to more than `budget` bytes).
    pub(crate) fn new(mode: CopyHelper, spin: Duration, streaming: Streaming, budget: usize) -> Copier {
        Copier {
            shared: Arc::new(Shared {
                state: AtomicU8::new(IDLE),
                job: Mutex::new(Vec::new()),
                claims: AtomicU64::new(0),
                stream: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                helped: AtomicU64::new(0),
                looking: AtomicBool::new(false),
            }),
            helper: None,
            mode,
            spin,
            streaming,
            budget,
            footprint: Footprint::new(),
            streamed: 0,
            running: None,
            spare: Vec::new(),
            started_running: 0,
            run_when_looking: true,
        }
    }

    /// The same copy engine, whose `start` never makes what happens next depend on the OS's
    /// scheduling: in `Auto` it copies every copy before returning (`Always` still leaves
    /// every large one running, which is a fixed rule). For devices on a virtual clock, whose
    /// runs a seed must replay.
    pub(crate) fn timing_free(mut self) -> Copier {
        self.run_when_looking = false;
        self
    }

    /// Copies [`Copier::start`] left running on the helper so far.
    pub(crate) fn started_running(&self) -> u64 {
        self.started_running
    }

    /// Copies made with streaming stores so far.
    pub(crate) fn streamed(&self) -> u64 {
        self.streamed
    }

    /// Whether a copy of `total` bytes to `segs` streams (and, in `Auto`, recording it).
    fn stream(&mut self, segs: &[Seg], total: usize) -> bool {
        let stream = match (self.streaming, segs.first()) {
            (Streaming::Off, _) | (_, None) => false,
            _ if total < STREAM_MIN || !streaming::AVAILABLE => false,
            (Streaming::Always, _) => true,
            (Streaming::Auto, Some(first)) => self.footprint.record(first.dst as usize, total) > self.budget,
        };
        self.streamed += u64::from(stream);
        stream
    }

    /// Copies the helper thread took part in so far.
    pub(crate) fn helped(&self) -> u64 {
        self.shared.helped.load(Ordering::Relaxed)
    }

    /// Copies every piece of `segs`.
    ///
    /// # Safety
    /// For the whole call, each piece's `src` is readable and its `dst` writable for its
    /// `len` bytes, and no destination overlaps a source or another destination.
    #[cfg(test)]
    pub(crate) unsafe fn copy(&mut self, segs: &[Seg]) {
        // SAFETY: the caller's promise, for the whole call, which `finish` ends.
        unsafe { self.post(segs, false) };
        self.finish();
    }

    /// Starts copying every piece of `segs`: a copy of at least [`ASYNC_MIN`] bytes while the
    /// helper is looking for work (always, in `Always`) is left running on it; any other is
    /// copied before this returns, as [`Copier::copy`] would. A copy already running is
    /// finished first.
    ///
    /// # Safety
    /// As for [`Copier::copy`], until the copy is done: this returned [`Started::Done`],
    /// [`Copier::is_done`] returned true, or [`Copier::finish`] (or the drop) returned.
    pub(crate) unsafe fn start(&mut self, segs: &[Seg]) -> Started {
        self.finish();
        // SAFETY: the caller's promise, until the copy is done.
        if unsafe { self.post(segs, true) } {
            self.started_running += 1;
            Started::Running
        } else {
            self.finish();
            Started::Done
        }
    }

    /// Whether no copy is running any more (the helper copied every chunk of it). A load;
    /// never waits.
    pub(crate) fn is_done(&mut self) -> bool {
        if self.running.is_some() && self.shared.state.load(Ordering::Acquire) == DONE {
            self.shared.state.store(IDLE, Ordering::Release);
            if let Some(run) = self.running.take() {
                self.spare = run.segs;
            }
        }
        self.running.is_none()
    }

    /// Completes the running copy, if any, on the calling thread: claims the chunks left and
    /// waits for the helper's last one.
    pub(crate) fn finish(&mut self) {
        let Some(run) = self.running.take() else { return };
        if self.mode == CopyHelper::Always {
            // The helper joins and takes what it can before the caller claims anything.
            wait_while(&self.shared.state, POSTED);
            wait_while(&self.shared.state, TAKEN);
        }
        // SAFETY: chunks of the poster's pieces, still valid (`start`'s and `copy`'s
        // promise); a chunk is claimed once, by one thread.
        unsafe { claim_chunks(&self.shared.claims, End::Back, &run.segs, run.stream) };
        match self.shared.state.compare_exchange(POSTED, IDLE, Ordering::AcqRel, Ordering::Acquire) {
            // Never joined: closed now, before the helper could touch any piece.
            Ok(_) => {}
            // Joined: every chunk is claimed; wait for the helper's last one.
            Err(_) => {
                wait_while(&self.shared.state, TAKEN);
                self.shared.state.store(IDLE, Ordering::Release);
            }
        }
        self.spare = run.segs;
    }

    /// Posts `segs` to the helper when it should share (`alone`: run) the copy, leaving it in
    /// `self.running`; otherwise copies inline. Returns whether it posted a job the helper may
    /// take alone.
    ///
    /// # Safety
    /// As for [`Copier::start`].
    unsafe fn post(&mut self, segs: &[Seg], alone: bool) -> bool {
        let total: usize = segs.iter().map(|s| s.len).fold(0, usize::saturating_add);
        let stream = self.stream(segs, total);
        // A copy of more chunks than a claims word counts (256 TiB) is made inline.
        let splits = total.div_ceil(CHUNK) <= MAX_CHUNKS;
        let runs = alone
            && splits
            && total >= ASYNC_MIN
            && (self.mode == CopyHelper::Always
                || (self.run_when_looking && self.shared.looking.load(Ordering::Acquire)));
        let helper = if runs || (splits && total >= SPLIT_MIN) { self.helper_for() } else { None };
        let Some(helper) = helper else {
            for s in segs {
                // SAFETY: the caller's promise, piece by piece.
                unsafe { s.run(stream) };
            }
            return false;
        };
        {
            let mut job = self.shared.job.lock().unwrap_or_else(PoisonError::into_inner);
            job.clear();
            job.extend_from_slice(segs);
        }
        self.shared.claims.store(Claims::all(total.div_ceil(CHUNK)), Ordering::Relaxed);
        self.shared.stream.store(stream, Ordering::Relaxed);
        self.shared.state.store(POSTED, Ordering::Release);
        helper.unpark();
        let mut pieces = std::mem::take(&mut self.spare);
        pieces.clear();
        pieces.extend_from_slice(segs);
        self.running = Some(Running { segs: pieces, stream });
        runs
    }

    /// The helper thread, started if need be; `None`: copy inline.
    fn helper_for(&mut self) -> Option<Thread> {
        if self.mode == CopyHelper::Off {
            return None;
        }
        if self.helper.is_none() {
            let (shared, spin) = (self.shared.clone(), self.spin);
            match std::thread::Builder::new().name("soft-copier".into()).spawn(move || helper(&shared, spin))
            {
                Ok(h) => self.helper = Some((h.thread().clone(), h)),
                Err(_) => {
                    // No thread: copy inline from now on.
                    self.mode = CopyHelper::Off;
                    return None;
                }
            }
        }
        self.helper.as_ref().map(|(t, _)| t.clone())
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        self.finish();
        self.shared.stop.store(true, Ordering::Release);
        if let Some((thread, handle)) = self.helper.take() {
            thread.unpark();
            let _ = handle.join();
        }
    }
}

/// Spins (yielding now and then) while `state` is `value`.
fn wait_while(state: &AtomicU8, value: u8) {
    let mut spins = 0u32;
    while state.load(Ordering::Acquire) == value {
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The unclaimed chunks of a job, `front..back`, packed in one word (`front` in the low half)
/// so that one compare-and-swap claims a chunk from either end.
struct Claims;

impl Claims {
    /// Every chunk of a job of `chunks` chunks (at most [`MAX_CHUNKS`]) unclaimed.
    fn all(chunks: usize) -> u64 {
        u64::try_from(chunks.min(MAX_CHUNKS)).unwrap_or(0) << 32
    }

    /// Claims the chunk at `end` of `word`'s range, if any is left.
    fn claim(word: &AtomicU64, end: End) -> Option<usize> {
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let (front, back) = (cur & u64::from(u32::MAX), cur >> 32);
            if front >= back {
                return None;
            }
            let (next, chunk) = match end {
                End::Front => (cur + 1, front),
                End::Back => (cur - (1 << 32), back - 1),
            };
            match word.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return usize::try_from(chunk).ok(),
                Err(seen) => cur = seen,
            }
        }
    }
}

/// Which end of a job's chunks a thread claims from: the helper from the front, the caller
/// from the back. Each thread then copies much the same part of every buffer, copy after
/// copy (the helper the start, the caller the end, meeting wherever their time says), and
/// each copies one contiguous run rather than every other chunk. Measured with
/// `bench/copy-split.c` (8 pairs of 1 MiB in memfd memory, two threads sharing each copy, six
/// processes): ordinary stores 34,124–45,803 MiB/s from both ends against 20,680–33,963
/// taking chunks in turn; streaming stores 19,749–36,450 against 18,749–35,499. In brw write
/// (whose copies stream), medians of alternating runs: 1M c8 21,354 against 20,358 MiB/s
/// (sixteen runs each), 4M c8 15,095 against 13,289 (ten).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Front,
    Back,
}

/// Claims chunks of `segs` from `end` of `claims` and copies them (streaming if `stream`)
/// until none is left; returns how many this thread copied.
///
/// # Safety
/// As for [`Copier::copy`], for as long as any thread may still claim a chunk.
unsafe fn claim_chunks(claims: &AtomicU64, end: End, segs: &[Seg], stream: bool) -> usize {
    let mut copied = 0;
    while let Some(i) = Claims::claim(claims, end) {
        let start = i.saturating_mul(CHUNK);
        // SAFETY: the caller's promise; `copy_range` stays inside the pieces.
        unsafe { copy_range(segs, start, start.saturating_add(CHUNK), stream) };
        copied += 1;
    }
    copied
}

/// Copies bytes `start..end` of the concatenation of `segs` (clipped to its length),
/// streaming if `stream`.
///
/// # Safety
/// As for [`Copier::copy`].
unsafe fn copy_range(segs: &[Seg], start: usize, end: usize, stream: bool) {
    let mut offset = 0usize;
    for s in segs {
        let (lo, hi) = (offset, offset.saturating_add(s.len));
        offset = hi;
        if hi <= start {
            continue;
        }
        if lo >= end {
            return;
        }
        let from = start.max(lo) - lo;
        let to = end.min(hi) - lo;
        // `from < to <= s.len`: a part of the piece.
        let part = Seg { src: s.src.wrapping_add(from), dst: s.dst.wrapping_add(from), len: to - from };
        // SAFETY: inside a piece the caller vouched for.
        unsafe { part.run(stream) };
    }
}

/// The helper thread: joins posted jobs until the copier goes.
fn helper(shared: &Shared, spin: Duration) {
    shared.looking.store(true, Ordering::Release);
    let clock = Clock::new();
    let mut last_job = clock.now();
    let mut last_yield = last_job;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        if shared.state.compare_exchange(POSTED, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            let copied = {
                let job = shared.job.lock().unwrap_or_else(PoisonError::into_inner);
                // Written before the job was posted, which the swap above acquired.
                let stream = shared.stream.load(Ordering::Relaxed);
                // SAFETY: the poster keeps its promise about these pieces until this job is
                // DONE (`Copier::finish` waits for that, `Copier::is_done` looks for it);
                // chunks are claimed once.
                unsafe { claim_chunks(&shared.claims, End::Front, &job, stream) }
            };
            if copied > 0 {
                shared.helped.fetch_add(1, Ordering::Relaxed);
            }
            shared.state.store(DONE, Ordering::Release);
            last_job = clock.now();
            continue;
        }
        let now = clock.now();
        if now.saturating_duration_since(last_job) < spin {
            // Look at memory only, and give the CPU to any other runnable thread every
            // YIELD_EVERY (a yield per look would make the helper join late).
            if now.saturating_duration_since(last_yield) < YIELD_EVERY {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
                last_yield = now;
            }
        } else {
            // Unparked by the next post (or by drop); a token left by an earlier unpark only
            // makes this return at once. A job posted after `looking` went false finds the
            // helper parked, or about to park, and its unpark token wakes it.
            shared.looking.store(false, Ordering::Release);
            std::thread::park();
            shared.looking.store(true, Ordering::Release);
            last_job = clock.now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn the_environment_switch_names_the_modes() {
        let machine = CopyHelper::for_this_machine();
        for (v, want) in [
            (None, Some(machine)),
            (Some(""), Some(machine)),
            (Some("auto"), Some(machine)),
            (Some("1"), Some(machine)),
            (Some(" off "), Some(CopyHelper::Off)),
            (Some("0"), Some(CopyHelper::Off)),
            (Some("always"), Some(CopyHelper::Always)),
            (Some("allways"), None),
        ] {
            assert_eq!(CopyHelper::parse(v), want, "{v:?}");
        }
    }

    /// Random gather lists of random sizes around the split threshold, through the helper
    /// and without it, with ordinary and streaming stores; every byte lands where it belongs,
    /// and `Always` streams exactly the large copies.
    #[test]
    fn copies_land_whole_with_and_without_the_helper() {
        let mut rng = Rng::new(0xc0b1);
        let modes = [CopyHelper::Auto, CopyHelper::Always, CopyHelper::Off];
        let streams = [Streaming::Off, Streaming::Always, Streaming::Auto];
        for (mode, streaming) in modes.into_iter().flat_map(|m| streams.map(|s| (m, s))) {
            let mut copier = Copier::new(mode, Duration::from_micros(50), streaming, 1 << 20);
            let mut large = 0;
            for round in 0..100 {
                let pieces = 1 + rng.below(6) as usize;
                let lens: Vec<usize> = (0..pieces)
                    .map(|_| rng.below(2 * SPLIT_MIN as u64 / pieces as u64 + 1) as usize)
                    .collect();
                let total: usize = lens.iter().sum();
                large += u64::from(total >= STREAM_MIN);
                let mut src = vec![0u8; total];
                rng.fill(&mut src);
                let mut dst = vec![0u8; total];
                let mut segs = Vec::new();
                let mut off = 0;
                for &len in &lens {
                    segs.push(Seg { src: src[off..].as_ptr(), dst: dst[off..].as_mut_ptr(), len });
                    off += len;
                }
                // SAFETY: `src` and `dst` are distinct live vectors covering every piece.
                unsafe { copier.copy(&segs) };
                assert!(src == dst, "round {round}, {mode:?} {streaming:?}: pieces {lens:?}");
            }
            if mode == CopyHelper::Off {
                assert_eq!(copier.helped(), 0);
            }
            match streaming {
                Streaming::Off => assert_eq!(copier.streamed(), 0),
                Streaming::Always if streaming::AVAILABLE => assert_eq!(copier.streamed(), large),
                Streaming::Always => assert_eq!(copier.streamed(), 0),
                Streaming::Auto => assert!(copier.streamed() <= large),
            }
        }
    }

    /// `Auto` streams while the recent large copies' distinct destinations add up to more
    /// than the budget, and stops once the copies come back to fewer buffers.
    #[test]
    fn auto_streams_only_while_the_destinations_outgrow_the_budget() {
        if !streaming::AVAILABLE {
            println!("skipped: no streaming stores on this target");
            return;
        }
        const LEN: usize = STREAM_MIN;
        let src: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
        let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; LEN]).collect();
        // A budget of 4 buffers.
        let mut copier = Copier::new(CopyHelper::Auto, Duration::from_micros(50), Streaming::Auto, 4 * LEN);
        let copy_to = |copier: &mut Copier, buf: &mut Vec<u8>| {
            buf.fill(0);
            let seg = Seg { src: src.as_ptr(), dst: buf.as_mut_ptr(), len: LEN };
            // SAFETY: two distinct live vectors of the piece's length.
            unsafe { copier.copy(&[seg]) };
            assert!(*buf == src);
        };
        // 2 buffers in turn: 2 * LEN, within the budget.
        for i in 0..100 {
            copy_to(&mut copier, &mut bufs[i % 2]);
        }
        assert_eq!(copier.streamed(), 0);
        // 8 buffers in turn: the first 4 copies fit in the budget, every later one streams.
        for i in 0..100 {
            copy_to(&mut copier, &mut bufs[i % 8]);
        }
        assert_eq!(copier.streamed(), 100 - 4, "the first copies to buffers 0 to 3 fit");
        // Back to one buffer: the others leave the window, and the copies stop streaming.
        for _ in 0..2 * streaming::WINDOW {
            copy_to(&mut copier, &mut bufs[0]);
        }
        let before = copier.streamed();
        for _ in 0..10 {
            copy_to(&mut copier, &mut bufs[0]);
        }
        assert_eq!(copier.streamed(), before);
        // Small copies never stream, however many buffers.
        let mut small = Copier::new(CopyHelper::Off, Duration::ZERO, Streaming::Always, 0);
        let seg = Seg { src: src.as_ptr(), dst: bufs[1].as_mut_ptr(), len: STREAM_MIN - 1 };
        // SAFETY: as above, a shorter piece.
        unsafe { small.copy(&[seg]) };
        assert_eq!(small.streamed(), 0);
    }

    /// `Always`: the helper takes part in every large copy, and in no small one.
    #[test]
    fn the_helper_takes_part_in_every_large_copy_when_waited_for() {
        let mut copier = Copier::new(CopyHelper::Always, Duration::ZERO, Streaming::Auto, usize::MAX);
        let src: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; 4 << 20];
        for round in 0..50u64 {
            dst.fill(0);
            let seg = Seg { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: src.len() };
            // SAFETY: two distinct live vectors of the piece's length.
            unsafe { copier.copy(&[seg]) };
            assert!(dst == src);
            assert_eq!(copier.helped(), round + 1);
        }
        let seg = Seg { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: SPLIT_MIN - 1 };
        // SAFETY: as above, a shorter piece.
        unsafe { copier.copy(&[seg]) };
        assert_eq!(copier.helped(), 50, "a copy below SPLIT_MIN stays on the caller");
    }

    /// Spins until `cond` holds, for at most 10 s.
    fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
        let clock = Clock::new();
        let deadline = clock.now() + Duration::from_secs(10);
        while !cond() {
            if clock.now() > deadline {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// `start` leaves a copy running only while the helper looks for work: the first copy
    /// finds none started and is made before `start` returns (shared with the helper it
    /// starts); once the helper looks, copies
    /// of `ASYNC_MIN` and more run on it alone and land whole whether the caller waits for
    /// them (`is_done`) or finishes them (`finish`, racing the helper); smaller ones never run.
    #[test]
    fn started_copies_run_on_the_helper_once_it_looks_and_land_whole() {
        let mut copier = Copier::new(CopyHelper::Auto, Duration::from_secs(30), Streaming::Off, usize::MAX);
        let src: Vec<u8> = (0..1 << 20).map(|i| (i % 249) as u8).collect();
        let mut dst = vec![0u8; 1 << 20];
        let whole = |dst: &mut Vec<u8>| Seg { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: src.len() };
        // `src` and `dst` are distinct live vectors covering every piece below, and each copy
        // is done (`Done`, `is_done` or `finish`, or the drop) before either is touched again:
        // `start`'s promise, for every call.
        let start = |copier: &mut Copier, seg: Seg| {
            // SAFETY: as said above.
            unsafe { copier.start(&[seg]) }
        };
        assert_eq!(start(&mut copier, whole(&mut dst)), Started::Done);
        assert!(dst == src);
        assert!(
            wait_until(|| copier.shared.looking.load(Ordering::Acquire)),
            "the woken helper never looked"
        );
        let mut rng = Rng::new(0x5a17);
        for round in 0..200 {
            dst.fill(0);
            let len = ASYNC_MIN + rng.below((1 << 20) - ASYNC_MIN as u64 + 1) as usize;
            let seg = Seg { src: src.as_ptr(), dst: dst.as_mut_ptr(), len };
            assert_eq!(start(&mut copier, seg), Started::Running, "round {round}");
            if round % 2 == 0 {
                assert!(wait_until(|| copier.is_done()), "round {round}: the helper never finished");
            } else {
                copier.finish();
            }
            assert!(
                dst[..len] == src[..len] && dst[len..].iter().all(|&b| b == 0),
                "round {round}, {len} bytes"
            );
        }
        assert_eq!(copier.started_running(), 200);
        let seg = Seg { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: ASYNC_MIN - 1 };
        assert_eq!(start(&mut copier, seg), Started::Done, "a small copy stays on the caller");
        // A copy left running when the copier goes lands before the drop returns.
        dst.fill(0);
        assert_eq!(start(&mut copier, whole(&mut dst)), Started::Running);
        drop(copier);
        assert!(dst == src);
        // Without a helper nothing runs.
        let mut off = Copier::new(CopyHelper::Off, Duration::ZERO, Streaming::Off, usize::MAX);
        assert_eq!(start(&mut off, whole(&mut dst)), Started::Done);
    }

    /// Claims from the two ends meet in the middle: every chunk once, none after they meet.
    #[test]
    fn claims_from_both_ends_take_every_chunk_once() {
        let word = AtomicU64::new(Claims::all(5));
        let order = [End::Front, End::Back, End::Back, End::Front, End::Front, End::Back, End::Front];
        let got: Vec<Option<usize>> = order.iter().map(|&e| Claims::claim(&word, e)).collect();
        assert_eq!(got, [Some(0), Some(4), Some(3), Some(1), Some(2), None, None]);
        let empty = AtomicU64::new(Claims::all(0));
        assert_eq!(Claims::claim(&empty, End::Front), None);
        assert_eq!(Claims::claim(&empty, End::Back), None);
    }

    /// Two threads claiming at once, one from each end, over jobs of random sizes: between
    /// them they take every chunk exactly once, the front thread a prefix and the back thread
    /// the rest.
    #[test]
    fn concurrent_claims_split_each_job_into_a_prefix_and_a_suffix() {
        let mut rng = Rng::new(0x2e4d);
        for round in 0..200 {
            let chunks = rng.below(300) as usize;
            let word = AtomicU64::new(Claims::all(chunks));
            let claim_all = |end| {
                let mut mine = Vec::new();
                while let Some(i) = Claims::claim(&word, end) {
                    mine.push(i);
                }
                mine
            };
            let (front, back) = std::thread::scope(|s| {
                let f = s.spawn(|| claim_all(End::Front));
                let b = claim_all(End::Back);
                (f.join().unwrap_or_default(), b)
            });
            let split = front.len();
            assert!(front.iter().copied().eq(0..split), "round {round}: front {front:?}");
            assert!(back.iter().copied().eq((split..chunks).rev()), "round {round}: back {back:?}");
        }
    }

    /// Chunk boundaries inside and across pieces: every byte of a range, nothing outside.
    #[test]
    fn copy_range_copies_exactly_the_range_across_pieces() {
        let src: Vec<u8> = (1..=100).collect();
        for (start, end) in [(0, 100), (0, 7), (3, 4), (4, 10), (9, 61), (60, 100), (99, 200), (100, 150)] {
            let mut dst = [0u8; 100];
            let cuts = [0usize, 4, 10, 60, 100];
            let segs: Vec<Seg> = cuts
                .windows(2)
                .map(|w| Seg { src: src[w[0]..].as_ptr(), dst: dst[w[0]..].as_mut_ptr(), len: w[1] - w[0] })
                .collect();
            // SAFETY: the pieces cover `src` and `dst` exactly, two distinct live vectors.
            unsafe { copy_range(&segs, start, end, false) };
            for (i, &b) in dst.iter().enumerate() {
                let want = if (start..end).contains(&i) { src[i] } else { 0 };
                assert_eq!(b, want, "range {start}..{end}, byte {i}");
            }
        }
    }
}
