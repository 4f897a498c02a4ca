//! Registered memory: the software device's MR table, and the only code in it that touches
//! caller memory (by `memcpy`, or by `process_vm_readv` for the same-host path of
//! [`super::place`]).
//!
//! A region is an `(addr, len, pd, access)` entry found by its key. Every access names a key,
//! a protection domain, an address range and the access it needs; the table checks all four
//! before a single byte moves, exactly as an HCA checks its memory translation table. The
//! entry exists from registration until the [`super::SoftMr`] handle is dropped, and all
//! accesses happen under the device lock that deregistration also takes, so by the contract of
//! [`crate::fabric::Device::reg_mr`] the memory is valid whenever an entry is found.
//!
//! Keys are `index << 16 | variant`. A slot's variants are a random permutation of the 65,536
//! 16-bit values, walked one step per registration (a 4-round Feistel network on the slot's
//! registration count, keyed with 64 random bits drawn when the slot is created): a peer cannot
//! guess a live key from stale ones, and a deregistered key never matches again until its slot
//! has been registered 65,536 more times. (An HCA's 8-bit key variant is a plain counter.)

use super::copier::{Copier, Seg, Started};
use crate::fabric::Access;
use crate::rng::Rng;

/// Why a memory access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemFault {
    /// No live region has this key.
    BadKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The region does not grant the access.
    Access,
    /// The range is not inside the region (or overflows).
    Range,
}

/// Why a same-host placement ([`MrTable::write_from_process`]) failed.
#[derive(Debug)]
pub(crate) enum PlaceFault {
    /// The target range failed the MR check; nothing was written.
    Mem(MemFault),
    /// `process_vm_readv` failed (`EPERM`, `ESRCH`, `EFAULT`, ...); part of the range may hold
    /// new bytes, as after an interrupted RDMA WRITE.
    Os(std::io::Error),
}

/// Most iovecs one `process_vm_readv` takes (`UIO_MAXIOV`).
const MAX_IOV: usize = 1024;

#[derive(Clone, Copy, Debug)]
struct MrEntry {
    key: u32,
    pd: u32,
    addr: u64,
    len: u64,
    access: Access,
}

/// The table of live memory regions.
#[derive(Debug)]
pub(crate) struct MrTable {
    slots: Vec<Option<MrEntry>>,
    /// Per slot: the key permutation's secret and how many times the slot was registered.
    variants: Vec<(u64, u16)>,
    free: Vec<u16>,
    live: u32,
    max: u32,
}

impl MrTable {
    /// A table holding at most `max` regions (at most 65536).
    pub(crate) fn new(max: u32) -> MrTable {
        MrTable { slots: Vec::new(), variants: Vec::new(), free: Vec::new(), live: 0, max: max.min(1 << 16) }
    }

    /// Number of live regions.
    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    /// Adds a region and returns its key, or `None` when the table is full.
    pub(crate) fn register(
        &mut self,
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
        rng: &mut Rng,
    ) -> Option<u32> {
        if self.live >= self.max {
            return None;
        }
        let index = match self.free.pop() {
            Some(i) => usize::from(i),
            None => {
                if self.slots.len() >= 1 << 16 {
                    return None;
                }
                self.slots.push(None);
                self.variants.push((rng.next_u64(), 0));
                self.slots.len() - 1
            }
        };
        let (secret, count) = self.variants.get_mut(index).map(|v| (v.0, &mut v.1))?;
        let key = ((index as u32) << 16) | u32::from(variant(secret, *count));
        *count = count.wrapping_add(1);
        if let Some(slot) = self.slots.get_mut(index) {
            *slot = Some(MrEntry { key, pd, addr, len, access });
        }
        self.live += 1;
        Some(key)
    }

    /// Removes the region with this key; false if it was not live.
    ///
    /// (The slot's next key is the next step of its permutation; see the module notes.)
    pub(crate) fn deregister(&mut self, key: u32) -> bool {
        let index = (key >> 16) as usize;
        match self.slots.get_mut(index) {
            Some(slot @ Some(_)) if slot.is_some_and(|e| e.key == key) => {
                *slot = None;
                self.free.push(index as u16);
                self.live -= 1;
                true
            }
            _ => false,
        }
    }

    fn check(&self, pd: u32, key: u32, addr: u64, len: usize, need: Access) -> Result<MrEntry, MemFault> {
        let entry = self
            .slots
            .get((key >> 16) as usize)
            .copied()
            .flatten()
            .filter(|e| e.key == key)
            .ok_or(MemFault::BadKey)?;
        if entry.pd != pd {
            return Err(MemFault::WrongPd);
        }
        if !entry.access.contains(need) {
            return Err(MemFault::Access);
        }
        let end = addr.checked_add(len as u64).ok_or(MemFault::Range)?;
        let region_end = entry.addr.checked_add(entry.len).ok_or(MemFault::Range)?;
        if addr < entry.addr || end > region_end {
            return Err(MemFault::Range);
        }
        Ok(entry)
    }

    /// Checks that `len` bytes at `addr` may be written remotely under `key` (the RETH check
    /// made once per RDMA WRITE before any byte lands).
    pub(crate) fn check_remote_write(&self, pd: u32, key: u32, addr: u64, len: u64) -> Result<(), MemFault> {
        let len = usize::try_from(len).map_err(|_| MemFault::Range)?;
        self.check(pd, key, addr, len, Access::REMOTE_WRITE).map(|_| ())
    }

    /// Copies `out.len()` bytes from registered memory at `addr` (a local gather: no access
    /// flag is needed to read one's own region).
    pub(crate) fn read(&self, pd: u32, key: u32, addr: u64, out: &mut [u8]) -> Result<(), MemFault> {
        self.check(pd, key, addr, out.len(), Access::NONE)?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: `check` found a live region containing addr..addr+out.len(); by the
        // contract of `Device::reg_mr` that memory is valid for reads while the region is
        // registered, and deregistration needs the device lock our caller holds. `out` is a
        // device-owned buffer, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(addr as usize as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` into registered memory at `addr`, if the region grants `need`
    /// (LOCAL_WRITE for receives, REMOTE_WRITE for a peer's RDMA WRITE).
    pub(crate) fn write(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        data: &[u8],
        need: Access,
    ) -> Result<(), MemFault> {
        self.check(pd, key, addr, data.len(), need)?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `read`: a live region contains the whole range and is valid for
        // writes while registered (the caller promised at `reg_mr` not to hold references to
        // it while the device may write); `data` is a device-owned packet buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as usize as *mut u8, data.len()) };
        Ok(())
    }

    /// Checks `len` bytes at `addr` against a region `key` of PD `pd` with no access flag (a
    /// local gather list about to be named in a placement request).
    pub(crate) fn check_local(&self, pd: u32, key: u32, addr: u64, len: u64) -> Result<(), MemFault> {
        let len = usize::try_from(len).map_err(|_| MemFault::Range)?;
        self.check(pd, key, addr, len, Access::NONE).map(|_| ())
    }

    /// Fills `len` bytes at `addr` under `key` (REMOTE_WRITE, PD `pd`) by `memcpy` from
    /// `sources` (pointer, length), whose lengths add up to `len`: the same-host RDMA WRITE of
    /// [`super::place`] from a peer's mapped arena ([`super::peer_arena`]). The copy may be
    /// left running on the copy engine ([`Copier::start`]).
    ///
    /// # Safety
    /// Every source must be readable for its length until the copy is done (a range of a
    /// live mapping), and the caller must finish a running copy ([`Copier::finish`]) before
    /// this table deregisters any region (the device does so under its lock). A source's
    /// bytes may change under the copy (another process owns them): the copy then holds some
    /// mix of old and new, as a wire WRITE racing its source would.
    pub(crate) unsafe fn write_from_sources(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        len: u64,
        sources: &[(*const u8, u64)],
        copier: &mut Copier,
    ) -> Result<Started, MemFault> {
        let ulen = usize::try_from(len).map_err(|_| MemFault::Range)?;
        self.check(pd, key, addr, ulen, Access::REMOTE_WRITE)?;
        let mut done = 0usize;
        let mut segs = Vec::with_capacity(sources.len());
        for &(src, n) in sources {
            let n = usize::try_from(n).map_err(|_| MemFault::Range)?;
            let end = done.checked_add(n).filter(|&e| e <= ulen).ok_or(MemFault::Range)?;
            // done..end lies inside addr..addr+len (checked just above).
            segs.push(Seg { src, dst: (addr as usize as *mut u8).wrapping_add(done), len: n });
            done = end;
        }
        if done != ulen {
            return Err(MemFault::Range);
        }
        // SAFETY: `check` found a live region containing addr..addr+len, valid for writes
        // while registered, and it stays registered until the copy is done (the caller's
        // promise: deregistering memory a running copy writes finishes the copy first); every
        // destination lies
        // inside it and they do not overlap (consecutive ranges). Each source is readable for
        // its length until then (the caller's promise) and in another mapping, so no source
        // overlaps a destination.
        Ok(unsafe { copier.start(&segs) })
    }

    /// Fills `len` bytes at `addr` under `key` (REMOTE_WRITE, PD `pd`) with one copy from the
    /// memory of process `pid`: the gather list `remote` (address in that process, length),
    /// whose lengths add up to `len`. The same-host RDMA WRITE of [`super::place`].
    pub(crate) fn write_from_process(
        &self,
        pd: u32,
        key: u32,
        addr: u64,
        len: u64,
        pid: u32,
        remote: &[(u64, u64)],
    ) -> Result<(), PlaceFault> {
        let ulen = usize::try_from(len).map_err(|_| PlaceFault::Mem(MemFault::Range))?;
        self.check(pd, key, addr, ulen, Access::REMOTE_WRITE).map_err(PlaceFault::Mem)?;
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| PlaceFault::Os(std::io::Error::from_raw_os_error(libc::ESRCH)))?;
        let mut done = 0usize;
        while done < ulen {
            // The remote iovecs from byte `done` of the gather list on.
            let mut skip = done as u64;
            let mut riov = Vec::with_capacity(remote.len().min(MAX_IOV));
            for &(raddr, rlen) in remote {
                if riov.len() == MAX_IOV {
                    break;
                }
                if skip >= rlen {
                    skip -= rlen;
                    continue;
                }
                let base = raddr
                    .checked_add(skip)
                    .ok_or(PlaceFault::Os(std::io::Error::from_raw_os_error(libc::EFAULT)))?;
                let n = usize::try_from(rlen - skip).map_err(|_| PlaceFault::Mem(MemFault::Range))?;
                riov.push(libc::iovec { iov_base: base as usize as *mut libc::c_void, iov_len: n });
                skip = 0;
            }
            let local = libc::iovec {
                iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
                iov_len: ulen - done,
            };
            // SAFETY: `check` found a live region containing addr..addr+len, valid for writes
            // while registered (the caller promised at `reg_mr` not to hold references into it
            // while the device may write), and deregistration needs the device lock our caller
            // holds; the local iovec covers only the unwritten rest of that range, so the kernel
            // writes nowhere else. The remote iovecs are addresses in another process (or this
            // one): the kernel checks them and fails with EFAULT rather than touching anything
            // unmapped; it only reads them. Both iovec arrays are live locals for the call.
            let n = unsafe {
                libc::process_vm_readv(pid, &local, 1, riov.as_ptr(), riov.len() as libc::c_ulong, 0)
            };
            if n < 0 {
                return Err(PlaceFault::Os(std::io::Error::last_os_error()));
            }
            if n == 0 {
                return Err(PlaceFault::Os(std::io::Error::from_raw_os_error(libc::EFAULT)));
            }
            done += n as usize;
        }
        Ok(())
    }
}

/// Reads `out.len()` bytes at `addr` in process `pid` (a liveness word of [`super::live`]).
pub(crate) fn read_process(pid: u32, addr: u64, out: &mut [u8]) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: out.len() };
    // SAFETY: the local iovec is exactly `out`, a live exclusive borrow, so the kernel writes
    // nowhere else; the remote address is in another process (or this one) and only read, the
    // kernel failing with EFAULT rather than touching anything unmapped.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if n as usize != out.len() {
        return Err(std::io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

/// Step `count` of the permutation keyed by `secret`: a 4-round Feistel network on two bytes,
/// a bijection of the 16-bit values whatever the round function.
fn variant(secret: u64, count: u16) -> u16 {
    let [mut l, mut r] = count.to_be_bytes();
    for k in secret.to_le_bytes().chunks_exact(2) {
        let f = (r ^ k[0]).wrapping_mul(0x9d).rotate_left(3) ^ k[1];
        (l, r) = (r, l ^ f);
    }
    u16::from_be_bytes([l, r])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stale key never works again: 65,536 registrations of one slot all get different keys,
    /// and none of the earlier keys reaches the live region. Two tables (two devices, or two
    /// slots) walk different sequences.
    #[test]
    fn a_stale_key_never_matches_until_the_slot_is_reused_65536_times() {
        let mut rng = Rng::new(7);
        let mut t = MrTable::new(1);
        let mut buf = vec![0u8; 16];
        let base = buf.as_mut_ptr() as u64;
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mut seen = std::collections::HashSet::new();
        let mut previous = None;
        for _ in 0..1u32 << 16 {
            let key = t.register(1, base, 16, access, &mut rng).unwrap();
            assert!(seen.insert(key), "key {key:#x} came back");
            if let Some(stale) = previous {
                assert_eq!(t.write(1, stale, base, &[1], Access::REMOTE_WRITE), Err(MemFault::BadKey));
            }
            assert!(t.deregister(key));
            previous = Some(key);
        }
        assert_eq!(seen.len(), 1 << 16);
        // The sequence is the slot's own: another table's first keys differ.
        let mut other = MrTable::new(1);
        let mut rng2 = Rng::new(8);
        let firsts: Vec<u32> = (0..4)
            .map(|_| {
                let k = other.register(1, base, 16, access, &mut rng2).unwrap();
                other.deregister(k);
                k
            })
            .collect();
        let mut again = MrTable::new(1);
        let mut rng1 = Rng::new(7);
        let mine: Vec<u32> = (0..4)
            .map(|_| {
                let k = again.register(1, base, 16, access, &mut rng1).unwrap();
                again.deregister(k);
                k
            })
            .collect();
        assert_ne!(firsts, mine);
        assert!(buf.iter().all(|&b| b == 0), "no stale key wrote");
    }

    #[test]
    fn checks_key_pd_access_and_range_before_touching_memory() {
        let mut rng = Rng::new(1);
        let mut t = MrTable::new(8);
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        let key = t.register(1, base, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE, &mut rng).unwrap();
        let ro = t.register(1, base, 64, Access::LOCAL_WRITE, &mut rng).unwrap();

        assert_eq!(t.write(1, key, base + 8, &[7; 8], Access::REMOTE_WRITE), Ok(()));
        assert_eq!(t.write(2, key, base, &[1], Access::REMOTE_WRITE), Err(MemFault::WrongPd));
        assert_eq!(t.write(1, ro, base, &[1], Access::REMOTE_WRITE), Err(MemFault::Access));
        assert_eq!(t.write(1, key, base + 60, &[1; 8], Access::REMOTE_WRITE), Err(MemFault::Range));
        assert_eq!(t.write(1, key, base - 1, &[1], Access::REMOTE_WRITE), Err(MemFault::Range));
        assert_eq!(t.write(1, key, u64::MAX, &[1], Access::REMOTE_WRITE), Err(MemFault::Range));
        assert_eq!(t.write(1, key ^ 1, base, &[1], Access::REMOTE_WRITE), Err(MemFault::BadKey));
        assert_eq!(t.check_remote_write(1, key, base, 65), Err(MemFault::Range));

        let mut out = [0u8; 8];
        t.read(1, key, base + 8, &mut out).unwrap();
        assert_eq!(out, [7; 8]);
        assert!(t.deregister(key));
        assert!(!t.deregister(key));
        assert_eq!(t.read(1, key, base, &mut out), Err(MemFault::BadKey));
        assert_eq!(t.live(), 1);
        drop(buf);
    }

    #[test]
    fn placement_copies_from_a_process_only_into_a_checked_range() {
        let mut rng = Rng::new(3);
        let mut t = MrTable::new(8);
        let mut dst = vec![0u8; 64];
        let base = dst.as_mut_ptr() as u64;
        let key = t.register(1, base, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE, &mut rng).unwrap();
        let src: Vec<u8> = (0..48).collect();
        let (a, b) = (src.as_ptr() as u64, src.as_ptr() as u64 + 40);
        let me = std::process::id();
        t.write_from_process(1, key, base + 8, 48, me, &[(a, 40), (b, 8)]).unwrap();
        assert_eq!(&dst[8..56], &src[..]);
        assert_eq!(&dst[..8], &[0; 8]);
        assert_eq!(&dst[56..], &[0; 8]);
        let range = t.write_from_process(1, key, base + 32, 48, me, &[(a, 48)]);
        assert!(matches!(range, Err(PlaceFault::Mem(MemFault::Range))));
        let pd = t.write_from_process(2, key, base, 8, me, &[(a, 8)]);
        assert!(matches!(pd, Err(PlaceFault::Mem(MemFault::WrongPd))));
        // Requester addresses that are not mapped: EFAULT from the kernel, not a crash.
        let bad = t.write_from_process(1, key, base, 8, me, &[(8, 8)]);
        assert!(matches!(bad, Err(PlaceFault::Os(e)) if e.raw_os_error() == Some(libc::EFAULT)));
        // A gather list shorter than the length.
        let short = t.write_from_process(1, key, base, 16, me, &[(a, 8)]);
        assert!(matches!(short, Err(PlaceFault::Os(_))));
        drop(dst);
    }

    #[test]
    fn reused_slots_get_new_keys_and_the_table_has_a_limit() {
        let mut rng = Rng::new(2);
        let mut t = MrTable::new(2);
        let a = t.register(1, 0x1000, 16, Access::LOCAL_WRITE, &mut rng).unwrap();
        let _b = t.register(1, 0x2000, 16, Access::LOCAL_WRITE, &mut rng).unwrap();
        assert!(t.register(1, 0x3000, 16, Access::LOCAL_WRITE, &mut rng).is_none());
        assert!(t.deregister(a));
        let c = t.register(1, 0x3000, 16, Access::LOCAL_WRITE, &mut rng).unwrap();
        assert_eq!(a >> 16, c >> 16, "slot reused");
        assert_ne!(a, c, "with fresh random key bits");
    }
}
