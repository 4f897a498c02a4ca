//! The buffer arena: where [`Buffer`](crate::Buffer)s live, so that a device of another
//! process on the same host can map them.
//!
//! An RDMA WRITE between two processes on one host needs one copy from the requester's memory
//! into the target's. With ordinary heap memory that copy is a `process_vm_readv` system call,
//! which pins every source page for its duration. When the source lies in memory the target
//! has mapped, the copy is a plain `memcpy` with no system call. So buffers come from one
//! process-wide arena: a `memfd` of [`ARENA_LEN`] bytes, sparse (a page costs memory only once
//! touched), mapped shared. A same-host device (the `lnd` software fabric) publishes the
//! arena's fd, address and length ([`ArenaInfo`]) next to its identity; a peer that is allowed
//! to (the same user, as for `process_vm_readv`) opens it through `/proc/<pid>/fd/<fd>` and maps
//! it read-only.
//!
//! # Contract
//! - The file is sealed at creation (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): its length
//!   never changes, so a peer's read-only mapping can never fault past the end of the file
//!   (`SIGBUS`). A peer checks the seals before it maps.
//! - Memory is handed out in whole pages, zeroed. A freed block of [`PUNCH_MIN`] bytes or more
//!   is given back to the kernel (`fallocate(PUNCH_HOLE)`); smaller blocks are kept for reuse
//!   and zeroed again when handed out.
//! - The mapping is `MADV_DONTFORK`, as RDMA stacks do for registered memory: a forked child
//!   does not inherit it (it would otherwise share, not copy, its parent's buffers).
//! - Peers only ever *read* the arena. What a peer may see is whatever this process lends
//!   it by RDMA; a peer that maps the arena can read other buffers too, which is no more than
//!   `process_vm_readv` already lets a process of the same user do.
//! - When the arena cannot be made (no `memfd_create`, or `LNET_BUFFER_ARENA=0` in the
//!   environment) or is full, buffers come from the heap, and same-host copies of them use
//!   `process_vm_readv`. Nothing else changes.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Length of the arena: address space reserved, not memory.
pub const ARENA_LEN: usize = 16 << 30;
/// Granularity of the arena: a page.
pub const ARENA_PAGE: usize = 4096;
/// Freed blocks at least this long go back to the kernel.
pub const PUNCH_MIN: usize = 256 << 10;

/// What a peer needs to map a process's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaInfo {
    /// The arena's file descriptor in its process (open it as `/proc/<pid>/fd/<fd>`).
    pub fd: i32,
    /// Where the arena starts in its process.
    pub base: u64,
    /// Its length in bytes (the file's length, sealed).
    pub len: u64,
}

impl ArenaInfo {
    /// The offset of `len` bytes at `addr` (an address in the arena's process) in the arena, if
    /// they lie wholly inside it.
    pub fn offset_of(&self, addr: u64, len: u64) -> Option<u64> {
        let off = addr.checked_sub(self.base)?;
        (off.checked_add(len)? <= self.len).then_some(off)
    }
}

/// Free blocks: by offset (to merge neighbours) and by (length, offset) (to find a fit).
#[derive(Default)]
struct Free {
    by_off: BTreeMap<usize, usize>,
    by_len: BTreeSet<(usize, usize)>,
    /// Everything from here to the end is free.
    top: usize,
    /// Everything from here to the end reads as zero (never written since it was last given
    /// back to the kernel); free memory between `top` and here may hold old data.
    clean: usize,
}

impl Free {
    fn insert(&mut self, off: usize, len: usize) {
        self.by_off.insert(off, len);
        self.by_len.insert((len, off));
    }

    fn remove(&mut self, off: usize, len: usize) {
        self.by_off.remove(&off);
        self.by_len.remove(&(len, off));
    }

    /// A block of `len` bytes (a multiple of the page): (offset, how many of its first bytes
    /// may hold old data).
    fn take(&mut self, len: usize, limit: usize) -> Option<(usize, usize)> {
        if let Some(&(flen, off)) = self.by_len.range((len, 0)..).next() {
            self.remove(off, flen);
            if flen > len {
                self.insert(off + len, flen - len);
            }
            return Some((off, len));
        }
        let off = self.top;
        self.top = off.checked_add(len).filter(|&end| end <= limit)?;
        let dirty = self.clean.saturating_sub(off).min(len);
        self.clean = self.clean.max(self.top);
        Some((off, dirty))
    }

    /// Returns a block; if it (merged with its free neighbours) went back into the top, the
    /// new top.
    fn give(&mut self, mut off: usize, mut len: usize) -> Option<usize> {
        if let Some((&poff, &plen)) = self.by_off.range(..off).next_back() {
            if poff + plen == off {
                self.remove(poff, plen);
                off = poff;
                len += plen;
            }
        }
        if let Some(&nlen) = self.by_off.get(&(off + len)) {
            self.remove(off + len, nlen);
            len += nlen;
        }
        if off + len == self.top {
            self.top = off;
            return Some(off);
        }
        self.insert(off, len);
        None
    }
}

/// The process's buffer arena.
pub struct Arena {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    free: Mutex<Free>,
}

// SAFETY: the arena's memory is only handed out in disjoint blocks (under the mutex); the
// struct itself holds an fd, a fixed mapping address and a mutex-protected free list.
unsafe impl Send for Arena {}
// SAFETY: as above; every method takes the mutex before touching the free list.
unsafe impl Sync for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arena({:?})", self.info())
    }
}

static ARENA: OnceLock<Option<Arena>> = OnceLock::new();

/// The process's arena, made on first use; `None` if it cannot be (reported once on stderr)
/// or `LNET_BUFFER_ARENA` is `0`, `off` or `false`.
pub fn arena() -> Option<&'static Arena> {
    ARENA
        .get_or_init(|| {
            match std::env::var("LNET_BUFFER_ARENA").as_deref().map(str::trim) {
                Ok("0" | "off" | "false") => return None,
                Err(_) | Ok("" | "1" | "on" | "true" | "auto") => {}
                Ok(other) => eprintln!(
                    "lnet: LNET_BUFFER_ARENA={other:?} is not one of 1, on, 0 or off; using the arena"
                ),
            }
            Arena::new(ARENA_LEN)
                .inspect_err(|e| {
                    eprintln!("lnet: no buffer arena ({e}); buffers come from the heap");
                })
                .ok()
        })
        .as_ref()
}

impl Arena {
    /// Makes an arena of `len` bytes (a multiple of the page).
    pub fn new(len: usize) -> std::io::Result<Arena> {
        let len = len.next_multiple_of(ARENA_PAGE);
        // SAFETY: a static NUL-terminated name and valid flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(c"lnet-buffers".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: plain calls on our own descriptor; results checked.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), size) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: a new shared mapping of our own file, at an address the kernel chooses; the
        // file is `len` bytes long and sealed, so every mapped page is backed.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `p..p+len` is the mapping just made. Failure only means a child would inherit
        // it, so the result is not fatal.
        let _ = unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        let base =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Arena { fd, base, len, free: Mutex::new(Free::default()) })
    }

    /// What a peer needs to map the arena.
    pub fn info(&self) -> ArenaInfo {
        ArenaInfo { fd: self.fd.as_raw_fd(), base: self.base.as_ptr() as usize as u64, len: self.len as u64 }
    }

    /// Whether `len` bytes at `ptr` lie inside the arena.
    pub fn contains(&self, ptr: *const u8, len: usize) -> bool {
        self.info().offset_of(ptr as usize as u64, len as u64).is_some()
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `len` zeroed bytes (rounded up to whole pages), page-aligned; `None` if the arena is full.
    pub fn alloc(&self, len: usize) -> Option<NonNull<u8>> {
        self.alloc_with(len, true)
    }

    /// `len` bytes (rounded up to whole pages) whose contents are unspecified (old data of this
    /// process), for a caller that overwrites them at once; `None` if the arena is full.
    pub fn alloc_uninit(&self, len: usize) -> Option<NonNull<u8>> {
        self.alloc_with(len, false)
    }

    fn alloc_with(&self, len: usize, zero: bool) -> Option<NonNull<u8>> {
        let len = len.checked_next_multiple_of(ARENA_PAGE)?.max(ARENA_PAGE);
        let (off, dirty) = self.free().take(len, self.len)?;
        // SAFETY: `take` handed out `off..off+len` inside the mapping to us alone.
        let p = unsafe { self.base.as_ptr().add(off) };
        if zero && dirty > 0 {
            // SAFETY: the first `dirty` bytes of the block just taken: inside the mapping,
            // ours alone.
            unsafe { std::ptr::write_bytes(p, 0, dirty) };
        }
        NonNull::new(p)
    }

    /// Returns a block from [`Arena::alloc`] of the same `len`.
    ///
    /// # Safety
    /// `ptr` and `len` must be those of one `alloc` not yet freed, and nothing may use the
    /// block afterwards.
    pub unsafe fn dealloc(&self, ptr: NonNull<u8>, len: usize) {
        let Some(len) = len.checked_next_multiple_of(ARENA_PAGE).map(|l| l.max(ARENA_PAGE)) else { return };
        let off = ptr.as_ptr() as usize - self.base.as_ptr() as usize;
        // Under the lock: the free list and the clean mark change together with the pages.
        let mut free = self.free();
        let punch = match free.give(off, len) {
            // Back into the top: what lies between it and the clean mark goes back to the
            // kernel once it is large; small blocks stay, to be zeroed when taken again (a
            // block allocated and freed at the top over and over costs no system call).
            Some(top) if free.clean - top >= PUNCH_MIN => {
                let dirty = free.clean - top;
                free.clean = top;
                Some((top, dirty))
            }
            Some(_) => None,
            None if len >= PUNCH_MIN => Some((off, len)),
            None => None,
        };
        if let Some((off, len)) = punch {
            // Give the pages back. On failure (an old kernel) zero them by hand.
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            let (o, l) = (off as libc::off_t, len as libc::off_t);
            // SAFETY: a plain call on our own descriptor, for free pages no one uses.
            if unsafe { libc::fallocate(self.fd.as_raw_fd(), mode, o, l) } != 0 {
                // SAFETY: the block is inside the mapping, free, and we hold the lock.
                unsafe { std::ptr::write_bytes(self.base.as_ptr().add(off), 0, len) };
            }
        }
        drop(free);
    }

    /// Bytes handed out and not given back (pages).
    pub fn in_use(&self) -> usize {
        let free = self.free();
        free.top - free.by_off.values().sum::<usize>()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mapping; an arena is dropped only when no block is in use (the
        // process-wide one never is).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_zeroed_disjoint_reused_and_merged() {
        let a = Arena::new(64 * ARENA_PAGE).unwrap();
        let x = a.alloc(100).unwrap();
        let y = a.alloc(3 * ARENA_PAGE).unwrap();
        assert_eq!(a.in_use(), 4 * ARENA_PAGE);
        assert!(a.contains(x.as_ptr(), ARENA_PAGE));
        assert!(!a.contains(x.as_ptr(), 64 * ARENA_PAGE + 1));
        // SAFETY: x is a live block of one page.
        unsafe { std::ptr::write_bytes(x.as_ptr(), 0xab, ARENA_PAGE) };
        assert_eq!(y.as_ptr() as usize - x.as_ptr() as usize, ARENA_PAGE);
        let z = a.alloc(ARENA_PAGE).unwrap();
        // SAFETY: x was allocated with 100 bytes and is not used again.
        unsafe { a.dealloc(x, 100) };
        // The freed page comes back zeroed.
        let x2 = a.alloc(1).unwrap();
        assert_eq!(x2, x);
        // SAFETY: a live block of one page.
        assert!(unsafe { std::slice::from_raw_parts(x2.as_ptr(), ARENA_PAGE) }.iter().all(|&b| b == 0));
        // Freeing everything merges back into the untouched top.
        // SAFETY: each block freed once with its length.
        unsafe {
            a.dealloc(x2, 1);
            a.dealloc(z, ARENA_PAGE);
            a.dealloc(y, 3 * ARENA_PAGE);
        }
        assert_eq!(a.in_use(), 0);
        assert_eq!(a.free().top, 0);
        assert!(a.free().by_off.is_empty());
        // A block taken over old data is zeroed; one taken uninitialised is not.
        let d = a.alloc_uninit(ARENA_PAGE).unwrap();
        assert_eq!(d, x, "the top block again");
        // SAFETY: a live block of one page.
        unsafe { std::ptr::write_bytes(d.as_ptr(), 0x77, ARENA_PAGE) };
        // SAFETY: freed once.
        unsafe { a.dealloc(d, ARENA_PAGE) };
        let d = a.alloc_uninit(ARENA_PAGE).unwrap();
        // SAFETY: a live block of one page.
        assert_eq!(unsafe { *d.as_ptr() }, 0x77, "uninit: old data left as is");
        // SAFETY: freed once.
        unsafe { a.dealloc(d, ARENA_PAGE) };
        let z = a.alloc(ARENA_PAGE).unwrap();
        // SAFETY: a live block of one page.
        assert!(unsafe { std::slice::from_raw_parts(z.as_ptr(), ARENA_PAGE) }.iter().all(|&b| b == 0));
        // SAFETY: freed once.
        unsafe { a.dealloc(z, ARENA_PAGE) };
        // Full: the whole arena, then nothing.
        let all = a.alloc(64 * ARENA_PAGE).unwrap();
        assert!(a.alloc(1).is_none());
        // SAFETY: freed once.
        unsafe { a.dealloc(all, 64 * ARENA_PAGE) };
        assert!(a.alloc(usize::MAX).is_none());
    }

    /// Threads allocating, filling, checking and freeing blocks of mixed sizes at once: no
    /// block is ever handed to two owners, and every block starts zeroed.
    #[test]
    fn threads_never_share_a_block() {
        let a = std::sync::Arc::new(Arena::new(4096 * ARENA_PAGE).unwrap());
        let workers: Vec<_> = (0..4u8)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    let mut held: Vec<(NonNull<u8>, usize)> = Vec::new();
                    let mut x = u64::from(t) + 1;
                    for i in 0..2000usize {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let len = [100, ARENA_PAGE, 3 * ARENA_PAGE, PUNCH_MIN][(x % 4) as usize];
                        if let Some(p) = a.alloc(len) {
                            // SAFETY: a live block of `len` bytes, ours alone.
                            let b = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
                            assert!(b.iter().all(|&v| v == 0), "thread {t}: a block came back dirty");
                            b.fill(t + 1);
                            held.push((p, len));
                        }
                        if held.len() > 8 || (i % 3 == 0 && !held.is_empty()) {
                            let (p, len) = held.swap_remove((x as usize / 7) % held.len());
                            // SAFETY: a live block of `len` bytes, ours alone, freed once.
                            let b = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
                            assert!(b.iter().all(|&v| v == t + 1), "thread {t}: another owner wrote");
                            // SAFETY: as above.
                            unsafe { a.dealloc(p, len) };
                        }
                    }
                    for (p, len) in held {
                        // SAFETY: live blocks, freed once.
                        unsafe { a.dealloc(p, len) };
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        assert_eq!(a.in_use(), 0);
    }

    #[test]
    fn the_file_is_sealed_to_its_length() {
        let a = Arena::new(16 * ARENA_PAGE).unwrap();
        let fd = a.fd.as_raw_fd();
        // SAFETY: plain calls on a descriptor the arena owns.
        unsafe {
            let seals = libc::fcntl(fd, libc::F_GET_SEALS);
            assert_eq!(seals & libc::F_SEAL_SHRINK, libc::F_SEAL_SHRINK);
            assert_ne!(libc::ftruncate(fd, 0), 0, "shrinking must fail");
        }
        assert_eq!(a.info().len, 16 * ARENA_PAGE as u64);
        let i = a.info();
        assert_eq!(i.offset_of(i.base + 10, 5), Some(10));
        assert_eq!(i.offset_of(i.base - 1, 1), None);
        assert_eq!(i.offset_of(i.base + i.len - 4, 5), None);
        assert_eq!(i.offset_of(u64::MAX, 2), None);
    }

    #[test]
    fn a_large_block_goes_back_to_the_kernel_and_reads_zero() {
        let a = Arena::new(256 * ARENA_PAGE).unwrap();
        let keep = a.alloc(ARENA_PAGE).unwrap();
        let big = a.alloc(PUNCH_MIN).unwrap();
        let after = a.alloc(ARENA_PAGE).unwrap();
        // SAFETY: `big` is a live block of PUNCH_MIN bytes.
        unsafe { std::ptr::write_bytes(big.as_ptr(), 0x5a, PUNCH_MIN) };
        // SAFETY: freed once; then only read through a new allocation of the same block.
        unsafe { a.dealloc(big, PUNCH_MIN) };
        let again = a.alloc(PUNCH_MIN).unwrap();
        assert_eq!(again, big);
        // SAFETY: a live block of PUNCH_MIN bytes.
        assert!(unsafe { std::slice::from_raw_parts(again.as_ptr(), PUNCH_MIN) }.iter().all(|&b| b == 0));
        let _ = (keep, after);
    }
}
