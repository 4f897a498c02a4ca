//! A same-host peer's buffer arena, mapped read-only: placed WRITEs whose source lies in it are
//! copied with `memcpy`, no system call and no page pinning ([`super::place`]).
//!
//! A process's LNet buffers live in its arena ([`lnet_shim::arena`]), a sealed `memfd` whose fd,
//! address and length its registry entry publishes ([`super::registry`]). The responder opens
//! it through `/proc/<pid>/fd/<fd>` (the kernel allows that to the same user, the same check
//! as `process_vm_readv`), checks that the file is sealed against shrinking and at least as
//! long as published (so no read through the mapping can fault past its end), and maps it
//! read-only. The mapping is kept per source port and dropped when the port's process goes
//! away or restarts (`Placement::forget_departed` in [`super::place`]).
//!
//! Everything the peer publishes is untrusted: every gather entry and liveness word is checked
//! against the mapping with checked arithmetic, and anything outside it is copied the old way,
//! with `process_vm_readv`, whose failures are the peer's own.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use lnet_shim::arena::ArenaInfo;

/// The largest arena mapped (address space, not memory).
const MAX_ARENA: u64 = 1 << 40;

/// Another process's buffer arena, mapped read-only into this one.
#[derive(Debug)]
pub(crate) struct PeerArena {
    map: NonNull<u8>,
    info: ArenaInfo,
}

// SAFETY: a read-only mapping owned by this struct; it is only read through raw copies and
// atomic loads, from whichever thread holds the device.
unsafe impl Send for PeerArena {}

impl PeerArena {
    /// Maps the arena `info` of process `pid`.
    pub(crate) fn open(pid: u32, info: ArenaInfo) -> io::Result<PeerArena> {
        let invalid =
            |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("arena of pid {pid}: {what}"));
        if info.len == 0 || info.len > MAX_ARENA || info.len % 4096 != 0 || info.base % 4096 != 0 {
            return Err(invalid("implausible length or address"));
        }
        // The entry names the fd; only a memfd is opened (a FIFO or a device there would block
        // or act on open), and without blocking or taking a terminal whatever it turns out to be.
        let path = format!("/proc/{pid}/fd/{}", info.fd);
        let target = std::fs::read_link(&path)?;
        if !target.as_os_str().as_encoded_bytes().starts_with(b"/memfd:") {
            return Err(invalid("not a memfd"));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)?;
        if !file.metadata()?.file_type().is_file() {
            return Err(invalid("not a regular file"));
        }
        let fd = file.as_raw_fd();
        // SAFETY: a plain query on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(invalid("not a memfd sealed against shrinking"));
        }
        let size = file.metadata()?.len();
        if size < info.len {
            return Err(invalid("shorter than published"));
        }
        let len = usize::try_from(info.len).map_err(|_| invalid("too long"))?;
        // SAFETY: a new read-only shared mapping of a file at least `len` bytes long that can
        // never shrink, at an address the kernel chooses; reads of it cannot fault.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping just made; a forked child need not inherit it.
        let _ = unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        let map = NonNull::new(p.cast::<u8>()).ok_or_else(|| invalid("mapped at 0"))?;
        Ok(PeerArena { map, info })
    }

    /// Where `len` bytes at the peer's address `addr` are in the mapping, if wholly inside it.
    pub(crate) fn source(&self, addr: u64, len: u64) -> Option<*const u8> {
        let off = usize::try_from(self.info.offset_of(addr, len)?).ok()?;
        // SAFETY: `offset_of` checked `off + len <= info.len`, the mapping's length.
        Some(unsafe { self.map.as_ptr().add(off) }.cast_const())
    }

    /// Reads the 8-byte word at the peer's address `addr` (a liveness word) after everything
    /// read before it; `None` if it is not an aligned word inside the mapping.
    pub(crate) fn load_word(&self, addr: u64) -> Option<u64> {
        if addr % 8 != 0 {
            return None;
        }
        let p = self.source(addr, 8)?;
        // The copies of the data come before this load.
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: `p` is 8-aligned (the mapping is page-aligned and `addr - base` is a multiple
        // of 8, as `base` is page-aligned) and inside a mapping that lives as long as `self`; an
        // aligned atomic load of 8 bytes is allowed on read-only memory.
        Some(unsafe { &*p.cast::<AtomicU64>() }.load(Ordering::Acquire))
    }
}

impl Drop for PeerArena {
    fn drop(&mut self) {
        // SAFETY: our own mapping of exactly this length; nothing borrows from it beyond a call.
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.info.len as usize) };
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use lnet_shim::arena::Arena;

    use super::*;

    #[test]
    fn a_peer_arena_maps_read_only_and_checks_every_range() {
        let a = Arena::new(64 * 4096).unwrap();
        let block = a.alloc(8192).unwrap();
        // SAFETY: a live 8 KiB block.
        unsafe { std::ptr::write_bytes(block.as_ptr(), 0x42, 8192) };
        let info = a.info();
        let m = PeerArena::open(std::process::id(), info).unwrap();
        let addr = block.as_ptr() as u64;
        let src = m.source(addr, 8192).unwrap();
        // SAFETY: 8 KiB inside the mapping.
        assert!(unsafe { std::slice::from_raw_parts(src, 8192) }.iter().all(|&b| b == 0x42));
        assert_eq!(m.load_word(addr), Some(0x4242_4242_4242_4242));
        assert_eq!(m.load_word(addr + 1), None, "unaligned");
        assert!(m.source(info.base + info.len - 1, 2).is_none(), "past the end");
        assert!(m.source(info.base - 1, 1).is_none(), "before the start");
        assert!(m.source(u64::MAX - 1, 8).is_none());
        // A later write in the arena shows through the mapping (shared, not a snapshot).
        // SAFETY: a live block.
        unsafe { std::ptr::write_bytes(block.as_ptr(), 0x17, 8) };
        assert_eq!(m.load_word(addr), Some(0x1717_1717_1717_1717));
    }

    #[test]
    fn what_is_not_a_sealed_arena_is_refused() {
        let a = Arena::new(16 * 4096).unwrap();
        let me = std::process::id();
        let info = a.info();
        let longer = ArenaInfo { len: info.len * 2, ..info };
        assert_eq!(PeerArena::open(me, longer).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert!(PeerArena::open(me, ArenaInfo { len: 0, ..info }).is_err());
        assert!(PeerArena::open(me, ArenaInfo { len: 4097, ..info }).is_err());
        assert!(PeerArena::open(me, ArenaInfo { fd: 1_000_000, ..info }).is_err());
        // An ordinary file is not an arena; nor is a FIFO, which is never even opened (opening
        // one for reading would block until a writer came).
        let f = File::open("/proc/self/stat").unwrap();
        let plain = ArenaInfo { fd: f.as_raw_fd(), ..info };
        assert_eq!(PeerArena::open(me, plain).unwrap_err().kind(), io::ErrorKind::InvalidData);
        let mut fds = [0; 2];
        // SAFETY: pipe writes two descriptors into the live array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let fifo = ArenaInfo { fd: fds[0], ..info };
        assert_eq!(PeerArena::open(me, fifo).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // SAFETY: closing the two descriptors pipe gave us.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        // A memfd that is not sealed.
        // SAFETY: a static NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a plain call on the new descriptor.
        assert_eq!(unsafe { libc::ftruncate(raw, info.len as libc::off_t) }, 0);
        let unsealed = ArenaInfo { fd: raw, ..info };
        assert_eq!(PeerArena::open(me, unsealed).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // SAFETY: closing the descriptor memfd_create gave us.
        unsafe { libc::close(raw) };
        // A process that is not there.
        assert!(PeerArena::open(u32::MAX, info).is_err());
    }
}
