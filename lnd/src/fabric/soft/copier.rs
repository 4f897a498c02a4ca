//! Large same-host copies on two cores: a copy engine for the placement path.
//!
//! A placed RDMA WRITE is one `memcpy` from the requester's mapped arena into the responder's
//! registered memory, made by the responder's scheduler thread (under the device lock, before
//! the WRITE is acknowledged). For large WRITEs that copy is most of that thread's work, while
//! another core may sit idle. A [`Copier`] is the device's copy engine: one helper thread,
//! started on first use, that takes the second half of every copy of at least
//! [`SPLIT_MIN`] bytes while the caller copies the first.
//!
//! The contract is a plain synchronous copy: [`Copier::copy`] returns when every byte is in
//! place, so RC ordering, the protection checks made before it and the lifetime of the memory
//! involved are exactly those of a `memcpy` on the calling thread. The helper never blocks the
//! caller: if it has not picked the half up by the time the caller finishes its own half (it
//! is asleep, or its core is busy), the caller takes the half back and copies it too. Only a
//! half the helper has already started is waited for, and that wait is one half-copy long.
//!
//! Idle costs nothing: after a job the helper looks for the next for [`HELPER_SPIN`], yielding
//! the CPU, then parks until the next large copy unparks it.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crate::clock::Clock;

/// Copies smaller than this stay on the calling thread (waking the helper costs more).
pub const SPLIT_MIN: usize = 256 << 10;
/// How long the helper keeps looking for the next job before it parks.
const HELPER_SPIN: Duration = Duration::from_micros(50);

const IDLE: u8 = 0;
const POSTED: u8 = 1;
const TAKEN: u8 = 2;
const DONE: u8 = 3;

/// Whether and how a device splits large copies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyHelper {
    /// Every copy on the responder's thread.
    Off,
    /// Large copies split with the helper thread when it is free to take its half in time
    /// (the default, on machines with more than one CPU).
    #[default]
    Auto,
    /// Every large copy split, the caller waiting for the helper to take its half even when
    /// copying alone would be quicker: for tests of the split path, which must not depend on
    /// how the OS schedules the helper.
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
}

/// One contiguous piece of a copy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) src: *const u8,
    pub(crate) dst: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: a `Seg` is only dereferenced inside `Copier::copy` (by the caller or, while the
// caller waits for it, by the helper), whose caller guarantees the memory for that long.
unsafe impl Send for Seg {}

impl Seg {
    /// Copies the piece.
    ///
    /// # Safety
    /// `src` readable and `dst` writable for `len` bytes, not overlapping.
    unsafe fn run(self) {
        // SAFETY: the caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(self.src, self.dst, self.len) };
    }
}

#[derive(Debug)]
struct Shared {
    state: AtomicU8,
    /// The helper's half of the posted job.
    job: Mutex<Vec<Seg>>,
    stop: AtomicBool,
    /// Halves the helper copied.
    helped: AtomicU64,
}

/// A device's copy engine (see the module notes).
#[derive(Debug)]
pub(crate) struct Copier {
    shared: Arc<Shared>,
    helper: Option<(Thread, JoinHandle<()>)>,
    /// The caller's half (reused).
    mine: Vec<Seg>,
    mode: CopyHelper,
}

impl Copier {
    /// A copy engine working in `mode`.
    pub(crate) fn new(mode: CopyHelper) -> Copier {
        Copier {
            shared: Arc::new(Shared {
                state: AtomicU8::new(IDLE),
                job: Mutex::new(Vec::new()),
                stop: AtomicBool::new(false),
                helped: AtomicU64::new(0),
            }),
            helper: None,
            mine: Vec::new(),
            mode,
        }
    }

    /// Halves the helper thread copied so far.
    pub(crate) fn helped(&self) -> u64 {
        self.shared.helped.load(Ordering::Relaxed)
    }

    /// Copies every piece of `segs`.
    ///
    /// # Safety
    /// For the whole call, each piece's `src` is readable and its `dst` writable for its
    /// `len` bytes, and no destination overlaps a source or another destination.
    pub(crate) unsafe fn copy(&mut self, segs: &[Seg]) {
        let total: usize = segs.iter().map(|s| s.len).fold(0, usize::saturating_add);
        let Some(helper) = self.helper_for(total) else {
            for s in segs {
                // SAFETY: the caller's promise, piece by piece.
                unsafe { s.run() };
            }
            return;
        };
        // Split at the middle byte: the caller takes the first half, the helper the second.
        let mut mine = std::mem::take(&mut self.mine);
        mine.clear();
        {
            let mut theirs = self.shared.job.lock().unwrap_or_else(PoisonError::into_inner);
            theirs.clear();
            split(segs, total / 2, &mut mine, &mut theirs);
        }
        self.shared.state.store(POSTED, Ordering::Release);
        helper.unpark();
        for s in &mine {
            // SAFETY: a part of one of the caller's pieces.
            unsafe { s.run() };
        }
        self.mine = mine;
        if self.mode == CopyHelper::Always {
            wait_while(&self.shared.state, POSTED);
        }
        match self.shared.state.compare_exchange(POSTED, IDLE, Ordering::AcqRel, Ordering::Acquire) {
            // Not picked up: ours again.
            Ok(_) => {
                let theirs = self.shared.job.lock().unwrap_or_else(PoisonError::into_inner);
                for s in theirs.iter() {
                    // SAFETY: a part of one of the caller's pieces, which the helper never
                    // started (it can only take the job from POSTED).
                    unsafe { s.run() };
                }
            }
            // Taken: the helper is copying; wait for it (one half-copy at most).
            Err(_) => {
                wait_while(&self.shared.state, TAKEN);
                self.shared.state.store(IDLE, Ordering::Release);
            }
        }
    }

    /// The helper thread for a copy of `total` bytes, started if need be; `None`: copy inline.
    fn helper_for(&mut self, total: usize) -> Option<Thread> {
        if self.mode == CopyHelper::Off || total < SPLIT_MIN {
            return None;
        }
        if self.helper.is_none() {
            let shared = self.shared.clone();
            match std::thread::Builder::new().name("soft-copier".into()).spawn(move || helper(&shared)) {
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

/// Splits `segs` at byte `at`: the bytes before it go to `first`, the rest to `second`.
fn split(segs: &[Seg], at: usize, first: &mut Vec<Seg>, second: &mut Vec<Seg>) {
    let mut offset = 0usize;
    for s in segs {
        let end = offset.saturating_add(s.len);
        if end <= at {
            first.push(*s);
        } else if offset >= at {
            second.push(*s);
        } else {
            let head = at - offset;
            first.push(Seg { len: head, ..*s });
            // `head < s.len`, so both pointers stay inside the piece.
            second.push(Seg {
                src: s.src.wrapping_add(head),
                dst: s.dst.wrapping_add(head),
                len: s.len - head,
            });
        }
        offset = end;
    }
}

/// The helper thread: takes posted halves until the copier goes.
fn helper(shared: &Shared) {
    let clock = Clock::new();
    let mut last_job = clock.now();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        if shared.state.compare_exchange(POSTED, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            {
                let job = shared.job.lock().unwrap_or_else(PoisonError::into_inner);
                for s in job.iter() {
                    // SAFETY: the poster waits in `Copier::copy` until DONE, keeping its
                    // promise about these pieces for that long.
                    unsafe { s.run() };
                }
            }
            shared.helped.fetch_add(1, Ordering::Relaxed);
            shared.state.store(DONE, Ordering::Release);
            last_job = clock.now();
            continue;
        }
        if clock.now().saturating_duration_since(last_job) < HELPER_SPIN {
            std::thread::yield_now();
        } else {
            // Unparked by the next post (or by drop); a token left by an earlier unpark only
            // makes this return at once.
            std::thread::park();
            last_job = clock.now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Random gather lists of random sizes around the split threshold, through the helper
    /// and without it; every byte lands where it belongs.
    #[test]
    fn copies_land_whole_with_and_without_the_helper() {
        let mut rng = Rng::new(0xc0b1);
        for mode in [CopyHelper::Auto, CopyHelper::Always, CopyHelper::Off] {
            let mut copier = Copier::new(mode);
            for round in 0..200 {
                let pieces = 1 + rng.below(6) as usize;
                let lens: Vec<usize> = (0..pieces)
                    .map(|_| rng.below(2 * SPLIT_MIN as u64 / pieces as u64 + 1) as usize)
                    .collect();
                let total: usize = lens.iter().sum();
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
                assert!(src == dst, "round {round}, {mode:?}: pieces {lens:?}");
            }
            if mode == CopyHelper::Off {
                assert_eq!(copier.helped(), 0);
            }
        }
    }

    /// `Always`: the helper copies the second half of every large copy, and nothing of a
    /// small one.
    #[test]
    fn the_helper_takes_the_second_half_of_large_copies() {
        let mut copier = Copier::new(CopyHelper::Always);
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

    #[test]
    fn split_cuts_one_piece_at_the_byte() {
        let src = [0u8; 10];
        let mut dst = [0u8; 10];
        let a = Seg { src: src.as_ptr(), dst: dst.as_mut_ptr(), len: 4 };
        let b = Seg { src: src[4..].as_ptr(), dst: dst[4..].as_mut_ptr(), len: 6 };
        let (mut first, mut second) = (Vec::new(), Vec::new());
        split(&[a, b], 7, &mut first, &mut second);
        assert_eq!(first.iter().map(|s| s.len).collect::<Vec<_>>(), vec![4, 3]);
        assert_eq!(second.iter().map(|s| s.len).collect::<Vec<_>>(), vec![3]);
        assert_eq!(second[0].src, src[7..].as_ptr());
        let (mut first, mut second) = (Vec::new(), Vec::new());
        split(&[a, b], 4, &mut first, &mut second);
        assert_eq!((first.len(), second.len()), (1, 1));
    }
}
