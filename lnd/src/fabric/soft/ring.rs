//! Same-host frame rings: frames between two ports of one host through shared memory instead
//! of the kernel's UDP stack.
//!
//! A [`super::wire::UdpWire`] with the same-host path on ([`super::place`]) sends its frames
//! to another same-host port through a single-producer single-consumer ring in a file of the
//! per-user registry directory ([`super::registry`]), `ring-<src ip>-<port>-to-<dst ip>`,
//! created (mode 0600, initialised, then renamed into place) and removed by the sender. The
//! frames are the same RoCEv2 frames the socket would carry, so the RC transport above is
//! unchanged; only their path differs.
//!
//! Layout (little-endian, 64-byte lines, then the data):
//!
//! ```text
//!   0  magic "LNDRING3"   8  nonce (the sender's, per ring)   16  capacity (bytes, 2^k)
//!  64  tail: bytes written (producer; for the producer and for inspection)
//! 128  head: bytes consumed (consumer)
//! 192  sleeping: 1 while the consumer may sleep (consumer)   196  rung (producer/consumer)
//! 4096 data: records [len u32, flags u32, stamp u64, frame, pad to 16];
//!      len 0xffff_ffff: wrap to the start; flags: 0, or 1 (`UNSEALED`: no ICRC, below)
//! ```
//!
//! **Publication.** A record is published by its stamp, the ring position it starts at
//! (bytes written before it, a count modulo 2^64) plus one, stored last with release
//! ordering. The consumer looks at the stamp where its `head` points, never at `tail`: the
//! record's own first cache line tells it that the record is there and brings its start, one
//! line crossing cores per frame instead of two (`tail`, then the record). A stamp left from
//! an earlier lap names another position, so stale bytes never pass for a record.
//!
//! **Wake-ups.** A consumer that is about to sleep in its poller sets `sleeping`, fences, and
//! looks at its rings once more (`RingRx::prepare_to_sleep`); a producer writes its record,
//! stamps it, fences, and reads `sleeping`: if set (and no doorbell is outstanding,
//! `rung`), it sends a doorbell, a 16-byte UDP datagram (`LNDBELL1` + the ring's nonce) to the
//! consumer's socket, which makes the consumer's poller return. With the two fences one of
//! the two always sees the other, so a frame is never left in a ring while its consumer
//! sleeps. While the consumer is awake (busy-polling), frames move without a system call.
//! A consumer learns of a ring from its first doorbell (a new ring starts with `sleeping` set)
//! and maps it by name.
//!
//! **Trust.** Rings live in the user's private directory, so only processes of the same user
//! can create them; their contents are still untrusted input: every index and length read
//! from shared memory is checked against the mapping before use, a ring that breaks the rules
//! is dropped, and its frames go through the same parsing as a datagram's. A full ring drops
//! the frame, as a full socket buffer would; RC retransmits it. One thing a producer can do
//! that the checks cannot catch: shrink the file under the mapping, after which the consumer's
//! next access to the lost pages faults (SIGBUS). The rings are plain files (the consumer opens
//! them by name; a memfd could be sealed against shrinking, as the buffer arena is), and only
//! processes of the same user can reach them, which can signal or trace the consumer anyway:
//! that is not a boundary a ring defends.
//!
//! **Unsealed frames.** A frame that goes from the sending device straight into a ring (no
//! fault injection in between: [`super::wire::Wire::immediate_route`]) crosses nothing but
//! this host's memory, which no link corrupts, so the device leaves its ICRC uncomputed (the
//! field zero) and the record says so (`UNSEALED`); the receiving device parses it without the
//! ICRC check. Every other frame, including every frame a fault injector may have altered on
//! its way into a ring, is sealed and checked. (The ICRC never guarded against a hostile
//! producer, which can compute it; the parsing does.) A record with flags other than 0 or
//! `UNSEALED` breaks the rules.

use std::fs;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

const MAGIC: u64 = u64::from_le_bytes(*b"LNDRING3");
/// The doorbell datagram's first 8 bytes; the ring's nonce follows.
pub(crate) const DOORBELL_MAGIC: [u8; 8] = *b"LNDBELL1";
/// Bytes of a doorbell datagram.
pub(crate) const DOORBELL_LEN: usize = 16;
/// Data bytes of a ring (4 MiB: a thousand 4 KiB frames; pages are touched only when used).
pub(crate) const RING_CAPACITY: usize = 4 << 20;
const HEADER: usize = 4096;
const OFF_NONCE: usize = 8;
const OFF_CAP: usize = 16;
const OFF_TAIL: usize = 64;
const OFF_HEAD: usize = 128;
const OFF_SLEEPING: usize = 192;
const OFF_RUNG: usize = 196;
const WRAP: u32 = u32::MAX;
/// Largest frame a record may hold.
const MAX_RECORD: usize = 16 << 10;
/// Bytes of a record prefetched ahead of its copy (a small SEND or an ACK, whole).
const PREFETCH: usize = 256;
/// A record's header: length, flags, the stamp.
const REC_HDR: usize = 16;
/// Record flag: the frame's ICRC was not computed (see the module doc).
const UNSEALED: u32 = 1;

/// The stamp that publishes a record starting at ring position `pos`.
fn stamp(pos: u64) -> u64 {
    pos.wrapping_add(1)
}

/// The ring file carrying frames from `src:port` to `dst` in `dir`.
pub(crate) fn ring_path(dir: &Path, src: Ipv4Addr, port: u16, dst: Ipv4Addr) -> PathBuf {
    dir.join(format!("ring-{src}-{port}-to-{dst}"))
}

/// A shared mapping of a ring file.
#[derive(Debug)]
struct Mapping {
    base: *mut u8,
    len: usize,
    cap: usize,
}

// SAFETY: the mapping is plain shared memory; all access to the shared header words goes
// through atomics, and the data area is touched only by the one side that owns each part
// (producer: free space; consumer: published records), so the pointer may move between threads.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `file` (already `HEADER + cap` bytes long) shared, read-write; `cap` is a power
    /// of two.
    fn map(file: &fs::File, cap: usize) -> io::Result<Mapping> {
        if !cap.is_power_of_two() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "ring capacity not a power of two"));
        }
        let len = HEADER + cap;
        // SAFETY: a fresh shared mapping of `len` bytes of an open file descriptor; the kernel
        // picks the address; the result is checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { base: base.cast(), len, cap })
    }

    /// Where ring position `pos` (a byte count, modulo 2^64) lies in the data area.
    fn offset(&self, pos: u64) -> usize {
        // `cap` is a power of two (`Mapping::map`): the remainder is the low bits.
        (pos & (self.cap as u64 - 1)) as usize
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HEADER && off % 8 == 0);
        // SAFETY: `off` is one of the fixed, 8-aligned header offsets, inside the mapping
        // (page-aligned base), which lives as long as `self`; shared words are only accessed
        // atomically by both processes.
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    /// The stamp word of a record at `at` in the data area; `None` unless `at` is 16-aligned
    /// and the record header fits.
    fn stamp_at(&self, at: usize) -> Option<&AtomicU64> {
        if at % REC_HDR != 0 || at.checked_add(REC_HDR).is_none_or(|end| end > self.cap) {
            return None;
        }
        // SAFETY: `at + 8..at + 16` is inside the data area (checked above) of a live mapping
        // whose base is page-aligned, so the word is 8-aligned; both processes access stamps
        // only atomically.
        Some(unsafe { &*self.base.add(HEADER + at + 8).cast::<AtomicU64>() })
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= HEADER && off % 4 == 0);
        // SAFETY: as in `u64_at`, for a 4-aligned header offset.
        unsafe { &*self.base.add(off).cast::<AtomicU32>() }
    }

    /// Copies `src` into the data area at `at` (the caller checked `at + src.len() <= cap`).
    fn write_data(&self, at: usize, src: &[u8]) {
        if at.checked_add(src.len()).is_none_or(|end| end > self.cap) {
            return;
        }
        // SAFETY: the range is inside the data area (checked above) of a live mapping, in the
        // part of the ring the producer owns (not yet published), which the consumer does not
        // read; `src` is a separate buffer of this process.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(HEADER + at), src.len()) };
    }

    /// Copies from the data area at `at` into `dst` (the caller checked the range).
    fn read_data(&self, at: usize, dst: &mut [u8]) {
        if at.checked_add(dst.len()).is_none_or(|end| end > self.cap) {
            return;
        }
        // SAFETY: the range is inside the data area (checked above) of a live mapping, in a
        // record the producer published (its stamp, acquire) and does not write until `head` moves
        // past it; a misbehaving producer can make the bytes garbage, which the frame checks
        // downstream reject, or shrink the file (a fault, see "Trust" above), not make this
        // copy touch memory outside the mapping. `dst` is a separate buffer of this process.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(HEADER + at), dst.as_mut_ptr(), dst.len()) };
    }

    /// Asks the CPU to start bringing the data area's lines at `at..at + len` into this core's
    /// cache, so that the copy that follows does not wait for them as long (measured: ping
    /// 8 B p50 4.0 -> 3.9 us; prefetching the producer's next lines for writing gained
    /// nothing). A hint only: nothing is read or written.
    fn prefetch(&self, at: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let end = at.saturating_add(len).min(self.cap);
            let mut line = at & !63;
            while line < end {
                // SAFETY: `line` is inside the data area of this live mapping (below `cap`), and
                // SSE (which has the prefetch instructions) is part of every x86-64 CPU; a
                // prefetch never faults and changes no memory.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(self.base.add(HEADER + line).cast::<i8>().cast_const())
                };
                line += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (at, len);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is the mapping made in `map`, unmapped exactly once here.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn round16(n: usize) -> usize {
    n.div_ceil(REC_HDR) * REC_HDR
}

/// The producer end of a ring (the sender's); dropping it removes the file.
#[derive(Debug)]
pub(crate) struct RingTx {
    map: Mapping,
    path: PathBuf,
    nonce: u64,
    /// The consumer's `head` as last read: free space is computed from it and `head` is read
    /// again only when that is too little (the consumer writes its line on every pop, so each
    /// read is a cache miss). A stale head only understates the free space.
    head_seen: u64,
}

/// What [`RingTx::push`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// In the ring; the consumer is awake (or already rung).
    Queued,
    /// In the ring; ring the consumer's doorbell.
    RingDoorbell,
    /// The ring is full (or the frame too large): dropped.
    Full,
}

impl RingTx {
    /// Creates the ring file at `path` (replacing any old one) with a fresh `nonce`.
    pub(crate) fn create(path: &Path, nonce: u64) -> io::Result<RingTx> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.set_len((HEADER + RING_CAPACITY) as u64)?;
        let map = Mapping::map(&file, RING_CAPACITY)?;
        map.u64_at(0).store(MAGIC, Ordering::Relaxed);
        map.u64_at(OFF_NONCE).store(nonce, Ordering::Relaxed);
        map.u64_at(OFF_CAP).store(RING_CAPACITY as u64, Ordering::Relaxed);
        // No consumer has seen it yet: the first frame rings the doorbell.
        map.u32_at(OFF_SLEEPING).store(1, Ordering::Release);
        fs::rename(&tmp, path)?;
        Ok(RingTx { map, path: path.to_owned(), nonce, head_seen: 0 })
    }

    /// This ring's nonce (carried by its doorbells).
    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Appends `frame`, sealed (its ICRC computed).
    #[cfg(test)]
    pub(crate) fn push(&mut self, frame: &[u8]) -> Pushed {
        self.push_record(frame, true)
    }

    /// Appends `frame`; `sealed` false marks a frame whose ICRC was not computed.
    pub(crate) fn push_record(&mut self, frame: &[u8], sealed: bool) -> Pushed {
        let cap = self.map.cap;
        if frame.len() > MAX_RECORD {
            return Pushed::Full;
        }
        let tail = self.map.u64_at(OFF_TAIL).load(Ordering::Relaxed);
        let at = self.map.offset(tail);
        let rec = REC_HDR + round16(frame.len());
        let skip = if at + rec > cap { cap - at } else { 0 };
        let free = |head: u64| {
            let used = tail.wrapping_sub(head);
            // More than the capacity: a consumer that broke the rules; stop writing.
            (used <= cap as u64).then(|| cap - used as usize)
        };
        if free(self.head_seen).is_none_or(|f| skip + rec > f) {
            self.head_seen = self.map.u64_at(OFF_HEAD).load(Ordering::Acquire);
            match free(self.head_seen) {
                Some(f) if skip + rec <= f => {}
                _ => return Pushed::Full,
            }
        }
        let mut pos = at;
        if skip > 0 {
            self.map.write_data(at, &[WRAP.to_le_bytes(), [0; 4]].concat());
            if let Some(st) = self.map.stamp_at(at) {
                st.store(stamp(tail), Ordering::Release);
            }
            pos = 0;
        }
        let mut head_bytes = [0u8; 8];
        head_bytes[..4].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        if !sealed {
            head_bytes[4..].copy_from_slice(&UNSEALED.to_le_bytes());
        }
        self.map.write_data(pos, &head_bytes);
        self.map.write_data(pos + REC_HDR, frame);
        // Published: the consumer may read the record from here on.
        if let Some(st) = self.map.stamp_at(pos) {
            st.store(stamp(tail.wrapping_add(skip as u64)), Ordering::Release);
        }
        self.map.u64_at(OFF_TAIL).store(tail.wrapping_add((skip + rec) as u64), Ordering::Release);
        // Pairs with the consumer's fence in `prepare_to_sleep`: either it sees this record,
        // or this sees its `sleeping`.
        fence(Ordering::SeqCst);
        if self.map.u32_at(OFF_SLEEPING).load(Ordering::Relaxed) != 0
            && self.map.u32_at(OFF_RUNG).swap(1, Ordering::AcqRel) == 0
        {
            Pushed::RingDoorbell
        } else {
            Pushed::Queued
        }
    }
}

impl Drop for RingTx {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A frame taken from a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Popped {
    /// Its length.
    pub(crate) len: usize,
    /// Whether its ICRC was computed (false: an unsealed frame, see the module doc).
    pub(crate) sealed: bool,
}

/// Why a ring was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The file is not a ring of ours (magic, nonce, size, owner or mode).
    NotARing,
    /// The producer broke the ring's rules (indices or lengths out of range).
    Corrupt,
}

/// The consumer end of a ring (the receiver's).
#[derive(Debug)]
pub(crate) struct RingRx {
    map: Mapping,
    nonce: u64,
}

impl RingRx {
    /// Maps the ring file at `path`, which must be a regular file of this user, mode 0600,
    /// of a ring with `nonce`.
    pub(crate) fn open(path: &Path, nonce: u64) -> Result<RingRx, RingError> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|_| RingError::NotARing)?;
        let m = file.metadata().map_err(|_| RingError::NotARing)?;
        let uid = fs::metadata("/proc/self").map_err(|_| RingError::NotARing)?.uid();
        if !m.is_file()
            || m.uid() != uid
            || m.mode() & 0o077 != 0
            || m.len() != (HEADER + RING_CAPACITY) as u64
        {
            return Err(RingError::NotARing);
        }
        let map = Mapping::map(&file, RING_CAPACITY).map_err(|_| RingError::NotARing)?;
        if map.u64_at(0).load(Ordering::Acquire) != MAGIC
            || map.u64_at(OFF_NONCE).load(Ordering::Relaxed) != nonce
            || map.u64_at(OFF_CAP).load(Ordering::Relaxed) != RING_CAPACITY as u64
        {
            return Err(RingError::NotARing);
        }
        let rx = RingRx { map, nonce };
        rx.awake();
        Ok(rx)
    }

    /// The nonce the ring was opened with.
    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Takes the next frame into `buf`: its length and whether it is sealed, `Ok(None)` if
    /// the ring is empty.
    pub(crate) fn pop(&mut self, buf: &mut [u8]) -> Result<Option<Popped>, RingError> {
        let cap = self.map.cap;
        // A wrap marker, then the record at the start: two looks at most.
        for _ in 0..2 {
            let head = self.map.u64_at(OFF_HEAD).load(Ordering::Relaxed);
            let at = self.map.offset(head);
            let Some(st) = self.map.stamp_at(at) else { return Err(RingError::Corrupt) };
            if st.load(Ordering::Acquire) != stamp(head) {
                return Ok(None);
            }
            let mut hdr = [0u8; 8];
            self.map.read_data(at, &mut hdr);
            let [l0, l1, l2, l3, f0, f1, f2, f3] = hdr;
            let len = u32::from_le_bytes([l0, l1, l2, l3]);
            if len == WRAP {
                if at == 0 {
                    return Err(RingError::Corrupt);
                }
                self.map.u64_at(OFF_HEAD).store(head.wrapping_add((cap - at) as u64), Ordering::Release);
                continue;
            }
            let len = len as usize;
            let rec = REC_HDR + round16(len);
            let flags = u32::from_le_bytes([f0, f1, f2, f3]);
            if len > MAX_RECORD || len > buf.len() || at + rec > cap || flags & !UNSEALED != 0 {
                return Err(RingError::Corrupt);
            }
            self.map.read_data(at + REC_HDR, &mut buf[..len]);
            self.map.u64_at(OFF_HEAD).store(head.wrapping_add(rec as u64), Ordering::Release);
            return Ok(Some(Popped { len, sealed: flags & UNSEALED == 0 }));
        }
        Err(RingError::Corrupt)
    }

    /// Whether a frame is waiting. If one is, its first lines start coming into the cache
    /// now, while the caller gets ready to [`RingRx::pop`] it.
    pub(crate) fn is_empty(&self) -> bool {
        let head = self.map.u64_at(OFF_HEAD).load(Ordering::Relaxed);
        let at = self.map.offset(head);
        // A head no record can start at is not empty: `pop` refuses the ring.
        let empty = self.map.stamp_at(at).is_some_and(|st| st.load(Ordering::Acquire) != stamp(head));
        if !empty {
            self.map.prefetch(self.map.offset(head), PREFETCH);
        }
        empty
    }

    /// The consumer may sleep from now on: producers ring the doorbell. False if a frame
    /// arrived meanwhile (then the consumer must not sleep; call [`RingRx::awake`]).
    pub(crate) fn prepare_to_sleep(&self) -> bool {
        // A doorbell rung late for an earlier sleep (the producer saw the old `sleeping`)
        // leaves `rung` set; clear it first, so that `rung` set means "a doorbell was sent
        // since the consumer last got ready to sleep", and this sleep gets its own.
        self.map.u32_at(OFF_RUNG).store(0, Ordering::Relaxed);
        self.map.u32_at(OFF_SLEEPING).store(1, Ordering::Relaxed);
        // Pairs with the producer's fence in `push`.
        fence(Ordering::SeqCst);
        self.is_empty()
    }

    /// The consumer is awake and polling: producers need not ring.
    pub(crate) fn awake(&self) {
        self.map.u32_at(OFF_SLEEPING).store(0, Ordering::Relaxed);
        self.map.u32_at(OFF_RUNG).store(0, Ordering::Release);
    }

    /// A doorbell for this ring was read, perhaps not by the thread that got ready to sleep
    /// (a device driven by several schedulers: any of them reads the socket, one sleeps on
    /// it). The doorbell is spent: `rung` is cleared, so that the next frame rings again
    /// while the consumer still says it may sleep, and the caller must look at the ring after
    /// this. Without it, the frames after a doorbell another thread took would wait for the
    /// sleeper's own timer. The swap reads the producer's `rung` with acquire ordering, so
    /// every record stamped before that doorbell was rung is visible to the look that
    /// follows; a record stamped later either is seen by that look or finds `rung` clear.
    pub(crate) fn doorbell_heard(&self) {
        self.map.u32_at(OFF_RUNG).swap(0, Ordering::AcqRel);
        fence(Ordering::SeqCst);
    }
}

/// Parses a doorbell datagram: the ring's nonce.
pub(crate) fn parse_doorbell(datagram: &[u8]) -> Option<u64> {
    let (magic, rest) = datagram.split_first_chunk::<8>()?;
    let nonce = rest.first_chunk::<8>()?;
    (*magic == DOORBELL_MAGIC && datagram.len() == DOORBELL_LEN).then(|| u64::from_le_bytes(*nonce))
}

/// The doorbell datagram of a ring with `nonce`.
pub(crate) fn doorbell(nonce: u64) -> [u8; DOORBELL_LEN] {
    let mut d = [0u8; DOORBELL_LEN];
    d[..8].copy_from_slice(&DOORBELL_MAGIC);
    d[8..].copy_from_slice(&nonce.to_le_bytes());
    d
}

/// What [`consume_hostile`] took from a ring.
#[doc(hidden)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Consumed {
    /// The length of each frame taken, in order.
    pub frames: Vec<usize>,
    /// The receive buffer's size.
    pub buf_len: usize,
    /// Why the consumer gave the ring up, if it did.
    pub error: Option<RingError>,
}

/// Fuzzing and tests: the bytes of a record (or, with `len` 0xffff_ffff, a wrap marker)
/// starting at ring position `pos`, padded as the producer pads it.
#[doc(hidden)]
pub fn hostile_record(pos: u64, len: u32, frame: &[u8]) -> Vec<u8> {
    let mut v = len.to_le_bytes().to_vec();
    v.extend_from_slice(&[0; 4]);
    v.extend_from_slice(&stamp(pos).to_le_bytes());
    v.extend_from_slice(frame);
    v.resize(REC_HDR + round16(frame.len()), 0);
    v
}

/// Capacity of the rings [`consume_hostile`] builds.
#[doc(hidden)]
pub const HOSTILE_CAPACITY: usize = 64 << 10;

/// Fuzzing: the consumer over a ring whose producer is hostile. `input` is a receive-buffer
/// size selector (byte 0), the ring's `head` and `tail` (bytes 1..9 and 9..17, little-endian;
/// the consumer never reads `tail`), then data written into the ring from `head`'s position
/// on (wrapping). Frames are taken until
/// the ring is empty or refused (at most 20,000). `None` if no anonymous ring can be made.
#[doc(hidden)]
pub fn consume_hostile(input: &[u8]) -> Option<Consumed> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let cap = HOSTILE_CAPACITY;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; a negative return is an error
    // and checked.
    let fd = unsafe { libc::memfd_create(c"lnd-ring-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
    let file = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len((HEADER + cap) as u64).ok()?;
    let map = Mapping::map(&file, cap).ok()?;
    let word =
        |at: usize| input.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    let (head, tail) = (word(1), word(9));
    map.u64_at(OFF_HEAD).store(head, Ordering::Relaxed);
    map.u64_at(OFF_TAIL).store(tail, Ordering::Relaxed);
    let mut at = (head % cap as u64) as usize;
    for chunk in input.get(17..).unwrap_or_default().chunks(64) {
        let first = chunk.len().min(cap - at);
        map.write_data(at, &chunk[..first]);
        map.write_data(0, &chunk[first..]);
        at = (at + chunk.len()) % cap;
    }
    let buf_len = [0, 8, 64, 4096, MAX_RECORD, 70_000][usize::from(input.first().copied().unwrap_or(0) % 6)];
    let mut buf = vec![0u8; buf_len];
    let mut rx = RingRx { map, nonce: 0 };
    let mut out = Consumed { buf_len, ..Consumed::default() };
    for _ in 0..20_000 {
        match rx.pop(&mut buf) {
            Ok(Some(p)) => out.frames.push(p.len),
            Ok(None) => break,
            Err(e) => {
                out.error = Some(e);
                break;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("lnd-ring-test-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn pair(name: &str) -> (RingTx, RingRx) {
        let path = dir().join(name);
        let tx = RingTx::create(&path, 0x5eed).unwrap();
        let rx = RingRx::open(&path, 0x5eed).unwrap();
        (tx, rx)
    }

    #[test]
    fn frames_come_out_in_order_across_many_wraps() {
        let (mut tx, mut rx) = pair("order");
        let mut buf = vec![0u8; MAX_RECORD];
        let (mut sent, mut got, mut bytes) = (0u64, 0u64, 0usize);
        // Odd sizes, several times around the ring, the consumer lagging behind.
        while got < 6000 {
            for _ in 0..7 {
                let len = (sent as usize * 37) % 4100 + 1;
                let frame: Vec<u8> = (0..len).map(|i| (sent as usize + i) as u8).collect();
                match tx.push(&frame) {
                    Pushed::Full => break,
                    _ => (sent, bytes) = (sent + 1, bytes + len),
                }
            }
            for _ in 0..5 {
                let Some(Popped { len: n, sealed: true }) = rx.pop(&mut buf).unwrap() else { break };
                let want = (got as usize * 37) % 4100 + 1;
                assert_eq!(n, want, "frame {got}");
                assert!(
                    buf[..n].iter().enumerate().all(|(i, &b)| b == (got as usize + i) as u8),
                    "frame {got}"
                );
                got += 1;
            }
        }
        assert!(bytes > 2 * RING_CAPACITY, "went around the ring at least twice: {bytes} bytes");
    }

    #[test]
    fn a_full_ring_drops_and_recovers() {
        let (mut tx, mut rx) = pair("full");
        let frame = vec![7u8; 4096];
        let mut n = 0;
        while tx.push(&frame) != Pushed::Full {
            n += 1;
        }
        assert_eq!(n, RING_CAPACITY / (4096 + REC_HDR));
        let mut buf = vec![0u8; 8192];
        assert_eq!(rx.pop(&mut buf).unwrap(), Some(Popped { len: 4096, sealed: true }));
        assert_ne!(tx.push(&frame), Pushed::Full);
        assert_eq!(tx.push(&vec![0u8; MAX_RECORD + 1]), Pushed::Full, "too large for a record");
    }

    #[test]
    fn the_doorbell_is_rung_once_per_sleep() {
        let (mut tx, mut rx) = pair("bell");
        // New ring: the consumer has not said it is awake (it has, in `open`; sleep again).
        assert!(rx.prepare_to_sleep());
        assert_eq!(tx.push(b"a"), Pushed::RingDoorbell);
        assert_eq!(tx.push(b"b"), Pushed::Queued, "rung already");
        assert!(!rx.prepare_to_sleep(), "frames are waiting: do not sleep");
        rx.awake();
        assert_eq!(tx.push(b"c"), Pushed::Queued, "awake: no doorbell");
        let mut buf = [0u8; 8];
        while rx.pop(&mut buf).unwrap().is_some() {}
        assert!(rx.prepare_to_sleep());
        assert_eq!(tx.push(b"d"), Pushed::RingDoorbell);
        // A doorbell rung late, after the consumer woke: the next sleep still gets its own.
        rx.awake();
        tx.map.u32_at(OFF_RUNG).store(1, Ordering::Relaxed);
        while rx.pop(&mut buf).unwrap().is_some() {}
        assert!(rx.prepare_to_sleep());
        assert_eq!(tx.push(b"e"), Pushed::RingDoorbell);
        assert_eq!(parse_doorbell(&doorbell(tx.nonce())), Some(0x5eed));
        assert_eq!(parse_doorbell(&doorbell(1)[..15]), None);
        assert_eq!(parse_doorbell(b"LNDBELL2\0\0\0\0\0\0\0\0"), None);
    }

    /// A doorbell read by a thread other than the sleeper (a device driven by several
    /// schedulers) is spent: the next frame rings again while the sleeper still sleeps.
    /// Without `doorbell_heard` the second push would not ring, and its frame would wait for
    /// the sleeper's timer.
    #[test]
    fn a_doorbell_another_thread_read_lets_the_next_frame_ring_again() {
        let (mut tx, mut rx) = pair("heard");
        assert!(rx.prepare_to_sleep());
        assert_eq!(tx.push(b"a"), Pushed::RingDoorbell);
        assert_eq!(tx.push(b"b"), Pushed::Queued, "rung already, not yet heard");
        // The other thread reads the doorbell, then the ring.
        rx.doorbell_heard();
        let mut buf = [0u8; 8];
        let mut got = 0;
        while rx.pop(&mut buf).unwrap().is_some() {
            got += 1;
        }
        assert_eq!(got, 2, "every frame stamped before the doorbell was heard is seen");
        assert_eq!(tx.push(b"c"), Pushed::RingDoorbell, "the sleeper still sleeps: ring again");
    }

    #[test]
    fn a_record_says_whether_its_frame_is_sealed_and_unknown_flags_are_refused() {
        let (mut tx, mut rx) = pair("flags");
        let mut buf = vec![0u8; 64];
        tx.push_record(b"sealed", true);
        tx.push_record(b"unsealed", false);
        assert_eq!(rx.pop(&mut buf), Ok(Some(Popped { len: 6, sealed: true })));
        assert_eq!(rx.pop(&mut buf), Ok(Some(Popped { len: 8, sealed: false })));
        assert_eq!(&buf[..8], b"unsealed");
        assert_eq!(rx.pop(&mut buf), Ok(None));
        // A flag this version does not know: the producer broke the rules.
        let (mut tx, mut rx) = pair("flags2");
        tx.push_record(b"hello", false);
        tx.map.write_data(4, &(UNSEALED | 2).to_le_bytes());
        assert_eq!(rx.pop(&mut buf), Err(RingError::Corrupt));
    }

    #[test]
    fn hostile_indices_and_lengths_are_refused() {
        let (mut tx, mut rx) = pair("hostile");
        let mut buf = vec![0u8; MAX_RECORD];
        tx.push(b"hello");
        // A stamp for another position (a record of an earlier or later lap): not a record.
        tx.map.stamp_at(0).unwrap().store(stamp(RING_CAPACITY as u64), Ordering::Release);
        assert!(rx.is_empty());
        assert_eq!(rx.pop(&mut buf), Ok(None));
        // A published record longer than a record may be.
        let (mut tx, mut rx) = pair("hostile2");
        tx.push(b"hello");
        tx.map.write_data(0, &(MAX_RECORD as u32 + 1).to_le_bytes());
        assert_eq!(rx.pop(&mut buf), Err(RingError::Corrupt));
        // A record running past the end of the ring, and a head no record starts at.
        let (tx, mut rx) = pair("hostile2b");
        let at = RING_CAPACITY - 32;
        rx.map.u64_at(OFF_HEAD).store(at as u64, Ordering::Relaxed);
        tx.map.write_data(at, &100u32.to_le_bytes());
        tx.map.stamp_at(at).unwrap().store(stamp(at as u64), Ordering::Release);
        assert_eq!(rx.pop(&mut buf), Err(RingError::Corrupt));
        rx.map.u64_at(OFF_HEAD).store(8, Ordering::Relaxed);
        assert!(!rx.is_empty(), "a misaligned head is reported, not waited on");
        assert_eq!(rx.pop(&mut buf), Err(RingError::Corrupt));
        // A wrap marker at the start of the ring (the producer never writes one there).
        let (tx, mut rx) = pair("hostile2c");
        tx.map.write_data(0, &WRAP.to_le_bytes());
        tx.map.stamp_at(0).unwrap().store(stamp(0), Ordering::Release);
        assert_eq!(rx.pop(&mut buf), Err(RingError::Corrupt));
        // A frame longer than the caller's buffer.
        let (mut tx, mut rx) = pair("hostile3");
        tx.push(&[1u8; 100]);
        assert_eq!(rx.pop(&mut buf[..50]), Err(RingError::Corrupt));
        // Not a ring: wrong nonce, wrong mode.
        let path = dir().join("notaring");
        let _tx = RingTx::create(&path, 1).unwrap();
        assert_eq!(RingRx::open(&path, 2).unwrap_err(), RingError::NotARing);
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(RingRx::open(&path, 1).unwrap_err(), RingError::NotARing);
        assert_eq!(RingRx::open(&dir().join("absent"), 1).unwrap_err(), RingError::NotARing);
    }

    /// The fuzzing helper reads well-formed rings as the consumer does, and refuses bad ones.
    #[test]
    fn the_hostile_consumer_takes_good_frames_and_refuses_bad_rings() {
        let input = |buf: u8, head: u64, data: &[u8]| {
            let mut v = vec![buf];
            v.extend_from_slice(&head.to_le_bytes());
            v.extend_from_slice(&0u64.to_le_bytes());
            v.extend_from_slice(data);
            v
        };
        let c = consume_hostile(&input(3, 0, &hostile_record(0, 12, b"hello, frame"))).unwrap();
        assert_eq!((c.frames, c.error), (vec![12], None));
        // A wrap marker in the ring's last 16 bytes, then the record at the start.
        let cap = HOSTILE_CAPACITY as u64;
        let wrapped =
            [hostile_record(cap - 16, WRAP, &[]), hostile_record(cap, 12, b"hello, frame")].concat();
        let c = consume_hostile(&input(3, cap - 16, &wrapped)).unwrap();
        assert_eq!((c.frames, c.error), (vec![12], None));
        // A record stamped for another lap is not there yet.
        let c = consume_hostile(&input(3, 0, &hostile_record(cap * 2, 12, b"hello, frame"))).unwrap();
        assert_eq!((c.frames, c.error), (vec![], None));
        let c = consume_hostile(&input(1, 0, &hostile_record(0, 12, b"hello, frame"))).unwrap();
        assert_eq!((c.frames, c.error), (vec![], Some(RingError::Corrupt)), "a frame larger than the buffer");
        let c = consume_hostile(&input(3, 3, &hostile_record(3, 12, b"hello, frame"))).unwrap();
        assert_eq!((c.frames, c.error), (vec![], Some(RingError::Corrupt)), "a head no record starts at");
        assert!(consume_hostile(&[]).unwrap().frames.is_empty());
        // Found by the `ring` fuzz target: indices near 2^64 (the producer may write `head` too)
        // overflowed the consumer's `head + record`. Indices are counters modulo 2^64.
        let near_end = consume_hostile(&[2, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd8]).unwrap();
        assert!(near_end.frames.len() <= 20_000);
        let head = u64::MAX - 15;
        let across = [hostile_record(head, WRAP, &[]), hostile_record(0, 12, b"hello, frame")].concat();
        let c = consume_hostile(&input(3, head, &across)).unwrap();
        assert_eq!((c.frames, c.error), (vec![12], None), "a record across the 2^64 wrap of the indices");
    }
}
