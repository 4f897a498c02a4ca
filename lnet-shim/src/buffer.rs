//! Buffers: memory an application hands to LNet and an LND may move by RDMA.
//!
//! A [`Buffer`] owns a page-aligned allocation that is only ever accessed by raw copies, never
//! through Rust references to its bytes: a network device may write it from another context at
//! any time the protocol allows (a receive, a peer's RDMA WRITE), exactly like memory shared with
//! an HCA. Ordering between the device and the owner comes from the protocol (an event or a
//! completion means the device is done with the bytes); overlapping concurrent access to the
//! same bytes is a race the protocol above must prevent, as with real DMA.
//!
//! The safe accessors ([`Buffer::read`], [`Buffer::write`], [`Buffer::copy_from`],
//! [`Buffer::fill_range`]) copy with relaxed atomic loads and stores (whole aligned words, bytes
//! at the edges), so safe code touching the same bytes from several threads gets an
//! unspecified mix of the values written, never undefined behaviour. What they cannot make
//! sound on their own is the device's side: a device writes the bytes with plain copies (an
//! HCA's DMA, outside the program; the software device's copies, in `unsafe` code), and an
//! application that reads or writes an MD's bytes while an operation on that MD is in flight
//! races with them. LNet's contract forbids that (an event says when the device is done), as
//! every RDMA interface does; it is not enforced by the types (an operation does not take
//! ownership of its buffer).
//!
//! The memory comes from the process's buffer arena ([`crate::arena`]) when there is one, so a
//! same-host peer's device can map it and copy from it without a system call; otherwise from
//! the heap.
//!
//! A buffer carries a small **registration cache**: an LND registers the buffer with its device
//! once ([`Buffer::registration`]) and finds the keys there next time; the registration is
//! dropped (deregistered) before the memory is freed, so no device can reach freed memory.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Alignment of every buffer: a page.
pub const BUFFER_ALIGN: usize = 4096;

/// An access outside a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("range {offset}+{len} is outside a buffer of {size} bytes")]
pub struct OutOfRange {
    /// Requested offset.
    pub offset: usize,
    /// Requested length.
    pub len: usize,
    /// Buffer size.
    pub size: usize,
}

/// Keys of a registration a device made of a whole buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegKeys {
    /// Local key (for the owner's gathers and scatters).
    pub lkey: u32,
    /// Remote key (for peers' RDMA WRITEs).
    pub rkey: u32,
}

struct Registration {
    owner: u64,
    keys: RegKeys,
    /// The device's handle (a memory region); dropping it deregisters.
    _handle: Box<dyn Any + Send + Sync>,
}

/// An owned, zero-initialised, page-aligned buffer that devices may access.
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    /// Whether the memory is an arena block (else a heap allocation).
    in_arena: bool,
    regs: Mutex<Vec<Registration>>,
}

// SAFETY: `Buffer` owns its allocation exclusively; all access to the bytes goes through raw
// copies whose ordering with device access is provided by the protocol (module docs). The
// registration list is behind a mutex and holds `Send + Sync` handles.
unsafe impl Send for Buffer {}
// SAFETY: every access through `&Buffer` is atomic (`atomic_copy`, `fill_range`, the word
// loads and stores of `fill_words` and `words_match`) or the registration list behind its
// mutex, so shared references on several threads cannot make a data race among themselves. Device access (raw copies by `unsafe`
// code, DMA) is ordered with the application's by the LNet contract (module docs).
unsafe impl Sync for Buffer {}

/// Words copied at once by the atomic copies.
const WORD: usize = std::mem::size_of::<u64>();

/// Copies `len` bytes from `src` to `dst` with relaxed atomic loads and stores: aligned words
/// where both sides allow, bytes elsewhere.
///
/// # Safety
/// `src..src+len` must be readable and `dst..dst+len` writable for the call, and the two ranges
/// must not overlap; the memory is only accessed atomically by this function (other accesses
/// to it must be atomic too, or excluded by the caller).
unsafe fn atomic_copy(src: *const u8, dst: *mut u8, len: usize) {
    let mut i = 0;
    let aligned_together = (src as usize) % WORD == (dst as usize) % WORD;
    if aligned_together {
        while i < len && (dst as usize + i) % WORD != 0 {
            // SAFETY: `i < len`: inside both ranges (caller); a byte needs no alignment.
            unsafe { copy_byte(src.add(i), dst.add(i)) };
            i += 1;
        }
        while i + WORD <= len {
            // SAFETY: inside both ranges, and both addresses are 8-aligned (they share their
            // alignment and `dst + i` is aligned), as `AtomicU64` requires.
            unsafe {
                let w = (*src.add(i).cast::<AtomicU64>()).load(Ordering::Relaxed);
                (*dst.add(i).cast::<AtomicU64>()).store(w, Ordering::Relaxed);
            }
            i += WORD;
        }
    }
    while i < len {
        // SAFETY: `i < len`: inside both ranges (caller).
        unsafe { copy_byte(src.add(i), dst.add(i)) };
        i += 1;
    }
}

/// One byte of [`atomic_copy`].
///
/// # Safety
/// Both addresses valid for the access (see [`atomic_copy`]).
unsafe fn copy_byte(src: *const u8, dst: *mut u8) {
    // SAFETY: valid addresses (caller); `AtomicU8` has the size and alignment of `u8`.
    unsafe {
        let b = (*src.cast::<AtomicU8>()).load(Ordering::Relaxed);
        (*dst.cast::<AtomicU8>()).store(b, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:#x}+{})", self.addr(), self.len)
    }
}

impl Buffer {
    /// Allocates `len` zeroed bytes aligned to [`BUFFER_ALIGN`], from the buffer arena if
    /// there is one and it has room, else from the heap.
    ///
    /// # Panics
    /// If the allocation fails (as `Vec` does).
    pub fn new(len: usize) -> Buffer {
        if len > 0 {
            if let Some(ptr) = crate::arena::arena().and_then(|a| a.alloc(len)) {
                return Buffer { ptr, len, in_arena: true, regs: Mutex::new(Vec::new()) };
            }
        }
        Buffer::on_heap(len)
    }

    /// Allocates `len` zeroed bytes aligned to [`BUFFER_ALIGN`] on the heap, never in the
    /// arena: ordinary memory, which a same-host peer's device copies with `process_vm_readv`.
    ///
    /// # Panics
    /// If the allocation fails (as `Vec` does).
    pub fn on_heap(len: usize) -> Buffer {
        let regs = Mutex::new(Vec::new());
        if len == 0 {
            return Buffer {
                ptr: NonNull::<[u8; BUFFER_ALIGN]>::dangling().cast(),
                len: 0,
                in_arena: false,
                regs,
            };
        }
        let layout = Layout::from_size_align(len, BUFFER_ALIGN)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(Layout::new::<u8>()));
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Buffer { ptr, len, in_arena: false, regs }
    }

    /// A buffer holding a copy of `data` (in the arena, not zeroed first).
    pub fn from_slice(data: &[u8]) -> Buffer {
        let b = Buffer::new_unzeroed(data.len());
        // Cannot fail: same length. It overwrites every byte of the buffer.
        let _ = b.write(0, data);
        b
    }

    /// `len` bytes that are not zeroed first when they come from the arena: they may hold
    /// what an earlier buffer of this process held. For a caller that overwrites every byte
    /// before the buffer is used (cheaper than [`Buffer::new`] for small buffers, since the
    /// arena hands out whole pages).
    pub fn new_unzeroed(len: usize) -> Buffer {
        match crate::arena::arena().filter(|_| len > 0).and_then(|a| a.alloc_uninit(len)) {
            Some(ptr) => Buffer { ptr, len, in_arena: true, regs: Mutex::new(Vec::new()) },
            None => Buffer::on_heap(len),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte (what goes in an SGE or an RDMA descriptor).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// Whether the memory is in the process's buffer arena ([`crate::arena`]).
    pub fn in_arena(&self) -> bool {
        self.in_arena
    }

    /// A raw pointer to the first byte, for registration with a device.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfRange> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OutOfRange { offset, len, size: self.len }),
        }
    }

    /// Copies bytes `offset..offset+out.len()` into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfRange> {
        self.check(offset, out.len())?;
        // SAFETY: the range is inside our allocation (checked above); `out` is a separate
        // borrow, so the ranges do not overlap; `out` is ours alone for the call.
        unsafe { atomic_copy(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to bytes `offset..offset+data.len()`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfRange> {
        self.check(offset, data.len())?;
        // SAFETY: the range is inside our allocation (checked above); `data` is a separate
        // borrow, so the ranges do not overlap.
        unsafe { atomic_copy(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Stamps bytes `offset..offset+len` in place, without a copy: the `i`th 8-byte word gets
    /// `word(i)` (little-endian), and the bytes after the last whole word get the first bytes
    /// of `word(len / 8)`. Atomic stores, as [`Buffer::write`]'s.
    pub fn fill_words(
        &self,
        offset: usize,
        len: usize,
        mut word: impl FnMut(usize) -> u64,
    ) -> Result<(), OutOfRange> {
        self.check(offset, len)?;
        let base = self.ptr.as_ptr().wrapping_add(offset);
        let whole = len / WORD;
        for i in 0..whole {
            let w = word(i);
            let at = base.wrapping_add(i * WORD);
            if at as usize % WORD == 0 {
                // SAFETY: inside the checked range and 8-aligned, as `AtomicU64` requires.
                unsafe { (*at.cast::<AtomicU64>()).store(w.to_le(), Ordering::Relaxed) };
            } else {
                // SAFETY: the word's 8 bytes are inside the checked range; the source is a
                // local array of 8 bytes.
                unsafe { atomic_copy(w.to_le_bytes().as_ptr(), at, WORD) };
            }
        }
        let tail = word(whole).to_le_bytes();
        // SAFETY: the `len % 8` bytes after the last whole word are inside the checked range;
        // the source is a local array at least that long.
        unsafe { atomic_copy(tail.as_ptr(), base.wrapping_add(whole * WORD), len % WORD) };
        Ok(())
    }

    /// Whether bytes `offset..offset+len` hold what [`Buffer::fill_words`] with `word` stamps,
    /// read in place (atomic loads, as [`Buffer::read`]'s); stops at the first difference.
    pub fn words_match(
        &self,
        offset: usize,
        len: usize,
        mut word: impl FnMut(usize) -> u64,
    ) -> Result<bool, OutOfRange> {
        self.check(offset, len)?;
        let base = self.ptr.as_ptr().wrapping_add(offset);
        let whole = len / WORD;
        for i in 0..whole {
            let at = base.wrapping_add(i * WORD);
            let got = if at as usize % WORD == 0 {
                // SAFETY: inside the checked range and 8-aligned, as `AtomicU64` requires.
                u64::from_le(unsafe { (*at.cast::<AtomicU64>()).load(Ordering::Relaxed) })
            } else {
                let mut b = [0u8; WORD];
                // SAFETY: the word's 8 bytes are inside the checked range; `b` is a local array
                // of 8 bytes.
                unsafe { atomic_copy(at, b.as_mut_ptr(), WORD) };
                u64::from_le_bytes(b)
            };
            if got != word(i) {
                return Ok(false);
            }
        }
        let n = len % WORD;
        let mut tail = [0u8; WORD];
        // SAFETY: the `n` bytes after the last whole word are inside the checked range; `tail`
        // is a local array at least that long.
        unsafe { atomic_copy(base.wrapping_add(whole * WORD), tail.as_mut_ptr(), n) };
        Ok(tail[..n] == word(whole).to_le_bytes()[..n])
    }

    /// Copies `len` bytes from `src` at `src_offset` to this buffer at `offset` (the ranges may
    /// overlap: `src` may be this buffer).
    pub fn copy_from(
        &self,
        offset: usize,
        src: &Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<(), OutOfRange> {
        self.check(offset, len)?;
        src.check(src_offset, len)?;
        let (from, to) = (src.ptr.as_ptr().wrapping_add(src_offset), self.ptr.as_ptr().wrapping_add(offset));
        let overlap = (from as usize) < (to as usize + len) && (to as usize) < (from as usize + len);
        if overlap {
            // Through a bounce buffer: the atomic copy runs forwards only.
            let mut tmp = vec![0u8; len];
            src.read(src_offset, &mut tmp)?;
            return self.write(offset, &tmp);
        }
        // SAFETY: both ranges are inside their allocations (checked above) and do not overlap.
        unsafe { atomic_copy(from, to, len) };
        Ok(())
    }

    /// Sets bytes `offset..offset+len` to `byte`.
    pub fn fill_range(&self, offset: usize, len: usize, byte: u8) -> Result<(), OutOfRange> {
        self.check(offset, len)?;
        let chunk = [byte; 4096];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(chunk.len());
            self.write(offset + at, &chunk[..n])?;
            at += n;
        }
        Ok(())
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        let _ = self.fill_range(0, self.len, byte);
    }

    /// A copy of the bytes `offset..offset+len`.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, OutOfRange> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    fn regs(&self) -> MutexGuard<'_, Vec<Registration>> {
        self.regs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The keys `owner` registered this buffer under, registering it first if it has not.
    ///
    /// `register` receives the buffer's address and length and returns the device's handle
    /// (kept until the buffer is dropped, then dropped *before* the memory is freed) and the
    /// keys. `owner` identifies the device + protection domain, so one buffer can be
    /// registered with several devices.
    pub fn registration<E>(
        &self,
        owner: u64,
        register: impl FnOnce(*mut u8, usize) -> Result<(Box<dyn Any + Send + Sync>, RegKeys), E>,
    ) -> Result<RegKeys, E> {
        let mut regs = self.regs();
        if let Some(r) = regs.iter().find(|r| r.owner == owner) {
            return Ok(r.keys);
        }
        let (handle, keys) = register(self.as_mut_ptr(), self.len)?;
        regs.push(Registration { owner, keys, _handle: handle });
        Ok(keys)
    }

    /// Whether `owner` has registered this buffer.
    pub fn is_registered(&self, owner: u64) -> bool {
        self.regs().iter().any(|r| r.owner == owner)
    }

    /// Drops `owner`'s registration (deregistering it), if any.
    pub fn unregister(&self, owner: u64) {
        let dropped: Vec<Registration> = {
            let mut regs = self.regs();
            let (gone, keep): (Vec<_>, Vec<_>) = regs.drain(..).partition(|r| r.owner == owner);
            *regs = keep;
            gone
        };
        drop(dropped);
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // Deregister first: after this no device can reach the memory.
        let regs = std::mem::take(self.regs.get_mut().unwrap_or_else(PoisonError::into_inner));
        drop(regs);
        if self.in_arena {
            if let Some(arena) = crate::arena::arena() {
                // SAFETY: allocated in `new` from this arena with this length, not freed before;
                // `self` is going away, and no device can reach it any more.
                unsafe { arena.dealloc(self.ptr, self.len) };
            }
        } else if self.len > 0 {
            if let Ok(layout) = Layout::from_size_align(self.len, BUFFER_ALIGN) {
                // SAFETY: allocated in `new` with exactly this layout and not freed before.
                unsafe { dealloc(self.ptr.as_ptr(), layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Safe code on several threads writing and reading the same bytes at once: each word or
    /// byte read is one some writer wrote, nothing else.
    #[test]
    fn concurrent_safe_access_sees_only_written_values() {
        let b = Arc::new(super::Buffer::new(64 << 10));
        let writers: Vec<_> = [0x11u8, 0x22]
            .into_iter()
            .map(|v| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        b.write(i % 8, &[v; 60 << 10]).unwrap();
                    }
                })
            })
            .collect();
        let mut seen = vec![0u8; 64 << 10];
        for _ in 0..200 {
            b.read(0, &mut seen).unwrap();
            assert!(seen.iter().all(|&x| [0, 0x11, 0x22].contains(&x)));
        }
        for w in writers {
            w.join().unwrap();
        }
    }

    use super::*;

    /// Stamping and checking in place: every byte of the range, aligned or not, the tail
    /// after the last whole word included; nothing outside it; a changed byte anywhere is
    /// found; ranges past the end are refused.
    #[test]
    fn words_are_filled_and_matched_in_place() {
        let b = Buffer::new(4096);
        let word = |i: usize| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5a5a;
        for (offset, len) in [(0, 4096), (8, 1000), (3, 1001), (5, 7), (4096, 0), (100, 0)] {
            b.fill(0xee);
            b.fill_words(offset, len, word).unwrap();
            let all = b.to_vec(0, 4096).unwrap();
            let expect: Vec<u8> = (0..len).map(|k| word(k / 8).to_le_bytes()[k % 8]).collect();
            assert_eq!(&all[offset..offset + len], &expect[..], "{offset}+{len}");
            assert!(all[..offset].iter().chain(&all[offset + len..]).all(|&x| x == 0xee), "{offset}+{len}");
            assert_eq!(b.words_match(offset, len, word), Ok(true), "{offset}+{len}");
            for k in [0, len / 2, len.saturating_sub(1)].into_iter().filter(|&k| k < len) {
                let mut one = [0u8];
                b.read(offset + k, &mut one).unwrap();
                b.write(offset + k, &[one[0] ^ 1]).unwrap();
                assert_eq!(b.words_match(offset, len, word), Ok(false), "{offset}+{len}: byte {k}");
                b.write(offset + k, &one).unwrap();
            }
        }
        assert!(b.fill_words(4000, 97, word).is_err());
        assert!(b.words_match(usize::MAX, 2, word).is_err());
    }

    #[test]
    fn reads_and_writes_are_range_checked() {
        let b = Buffer::new(10000);
        assert_eq!(b.in_arena(), crate::arena::arena().is_some());
        assert!(!Buffer::on_heap(10000).in_arena());
        assert_eq!(b.addr() % BUFFER_ALIGN as u64, 0);
        b.write(9990, &[1; 10]).unwrap();
        assert!(b.write(9991, &[1; 10]).is_err());
        assert!(b.write(usize::MAX, &[1]).is_err());
        let mut out = [0u8; 10];
        b.read(9990, &mut out).unwrap();
        assert_eq!(out, [1; 10]);
        b.copy_from(0, &b, 9990, 10).unwrap();
        assert_eq!(b.to_vec(0, 10).unwrap(), vec![1; 10]);
        // Overlapping ranges of one buffer move as memmove would, both ways, at odd offsets.
        let pattern: Vec<u8> = (0..100u8).collect();
        for (from, to) in [(3usize, 20usize), (20, 3), (8, 16), (16, 8)] {
            b.write(0, &[0; 200]).unwrap();
            b.write(from, &pattern).unwrap();
            b.copy_from(to, &b, from, 100).unwrap();
            assert_eq!(b.to_vec(to, 100).unwrap(), pattern, "{from} -> {to}");
        }
        b.fill(7);
        assert_eq!(b.to_vec(5000, 2).unwrap(), vec![7, 7]);
        assert!(b.fill_range(9999, 2, 0).is_err());
        let empty = Buffer::new(0);
        assert!(empty.is_empty());
        assert!(empty.read(0, &mut []).is_ok());
        assert_eq!(Buffer::from_slice(b"abc").to_vec(0, 3).unwrap(), b"abc");
    }

    struct Handle(Arc<AtomicUsize>);
    impl Drop for Handle {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn registration_is_cached_per_owner_and_dropped_with_the_buffer() {
        let drops = Arc::new(AtomicUsize::new(0));
        let calls = AtomicUsize::new(0);
        let b = Buffer::new(64);
        let reg = |owner| {
            b.registration(owner, |ptr, len| {
                assert_eq!((ptr as usize as u64, len), (b.addr(), 64));
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ()>((
                    Box::new(Handle(drops.clone())) as Box<dyn Any + Send + Sync>,
                    RegKeys { lkey: 1, rkey: 2 },
                ))
            })
        };
        assert_eq!(reg(7).unwrap(), RegKeys { lkey: 1, rkey: 2 });
        assert_eq!(reg(7).unwrap(), RegKeys { lkey: 1, rkey: 2 });
        assert_eq!(calls.load(Ordering::SeqCst), 1, "registered once");
        reg(8).unwrap();
        assert!(b.is_registered(8));
        b.unregister(8);
        assert!(!b.is_registered(8));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        drop(b);
        assert_eq!(drops.load(Ordering::SeqCst), 2, "deregistered when the buffer goes");
    }
}
