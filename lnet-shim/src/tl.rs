//! TEMPORARY timeline probes (not for commit). Per-thread buffers, plain stores: no locked
//! instruction, so no fence is added to the code measured.
#![allow(missing_docs, unsafe_code, clippy::undocumented_unsafe_blocks)]
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
const T: usize = 8;
const N: usize = 1 << 19;
static NEXT: AtomicUsize = AtomicUsize::new(0);
static IDX: [AtomicUsize; T] = [const { AtomicUsize::new(0) }; T];
static BUF: [[AtomicU64; 2 * N]; T] = [const { [const { AtomicU64::new(0) }; 2 * N] }; T];
thread_local! { static ME: Cell<usize> = const { Cell::new(usize::MAX) }; }
#[inline(always)]
pub fn mark(tag: u8, arg: u32) {
    let t = unsafe { core::arch::x86_64::_rdtsc() };
    let me = ME.with(|m| {
        if m.get() == usize::MAX {
            m.set(NEXT.fetch_add(1, Ordering::Relaxed) % T);
        }
        m.get()
    });
    let i = IDX[me].load(Ordering::Relaxed);
    IDX[me].store(i + 1, Ordering::Relaxed);
    let i = i % N;
    BUF[me][2 * i].store(t, Ordering::Relaxed);
    BUF[me][2 * i + 1].store(((tag as u64) << 32) | arg as u64, Ordering::Relaxed);
}
pub fn dump() {
    use std::io::Write;
    let mut all = Vec::new();
    for me in 0..T {
        let n = IDX[me].load(Ordering::Relaxed).min(N);
        for i in 0..n {
            all.push((BUF[me][2 * i].load(Ordering::Relaxed), BUF[me][2 * i + 1].load(Ordering::Relaxed)));
        }
    }
    all.sort();
    let mut f = std::io::BufWriter::new(std::fs::File::create(format!("/tmp/tl-{}.txt", std::process::id())).unwrap());
    for (t, v) in all {
        let _ = writeln!(f, "{} {} {}", t, v >> 32, v & 0xffff_ffff);
    }
}
