//! Copies that go around the cache when the memory being written outgrows it.
//!
//! A placed WRITE is a `memcpy` into the responder's registered memory. While the buffers a
//! server writes into, with the peers' buffers they are copied from, fit in the last-level
//! cache, an ordinary copy runs at cache speed and leaves the data hot for whoever reads it
//! next. Once they do not fit (many large RPCs in flight: 32 of 1 MiB, 8 of 4 MiB), every
//! ordinary store first reads its destination line from memory and later writes it back,
//! and each copy evicts the lines the next one needs; non-temporal (streaming) stores write
//! whole lines straight to memory instead and, measured on the development machine
//! (`bench/copy-stores.c`), about double the rate of a copy loop over 64 MiB of buffers (8436
//! → 16925 MiB/s) while losing to an ordinary copy on buffers that fit (21967 against 34840
//! MiB/s over 2 MiB).
//!
//! So the copy engine ([`super::copier`]) asks a `Footprint`: it remembers where the last
//! [`WINDOW`] large copies wrote, and the bytes of their distinct destinations estimate the
//! memory in play. Above the budget (an eighth of the largest CPU cache, [`cache_budget`])
//! large copies stream; below it they are ordinary `memcpy`s. Small
//! copies (under [`STREAM_MIN`]) never stream and are not counted: a streaming copy ends
//! with a store fence, which they cannot amortise.
//!
//! Streaming stores are weakly ordered; `stream_copy` ends with `sfence`, so its bytes are
//! visible before anything the caller stores after it (the WRITE's acknowledgement, the SEND
//! behind it), exactly as after a `memcpy`. Only x86-64 has them here ([`AVAILABLE`]);
//! elsewhere no copy streams, whatever the setting.

/// Whether large copies may bypass the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Streaming {
    /// Large copies stream while the recent destinations outgrow the cache budget (the
    /// default).
    #[default]
    Auto,
    /// Every copy is an ordinary `memcpy`.
    Off,
    /// Every large copy streams: for tests of the streaming path.
    Always,
}

impl Streaming {
    /// The mode a value of `LND_SOFT_STREAMING` asks for: `off`/`0`/`false`, `always`, or
    /// `Auto` (unset, empty, `auto`, `on`, `1`, `true`); `None` for a value that names no mode.
    pub fn parse(value: Option<&str>) -> Option<Streaming> {
        match value.map(str::trim) {
            None | Some("" | "1" | "on" | "true" | "auto") => Some(Streaming::Auto),
            Some("0" | "off" | "false") => Some(Streaming::Off),
            Some("always") => Some(Streaming::Always),
            Some(_) => None,
        }
    }

    /// The default: `LND_SOFT_STREAMING`, or `Auto` when unset. A value that names no mode is
    /// reported once on stderr and means `Auto`.
    pub fn from_env() -> Streaming {
        super::setting_from_env("LND_SOFT_STREAMING", Streaming::parse, "auto, off or always", || {
            Streaming::Auto
        })
    }
}

/// Whether this target has streaming stores (x86-64: SSE2's `movntdq`, always present).
pub const AVAILABLE: bool = cfg!(target_arch = "x86_64");
/// Copies smaller than this never stream and do not count in the footprint.
pub const STREAM_MIN: usize = 256 << 10;
/// How many recent large copies the footprint remembers.
pub const WINDOW: usize = 64;
/// The budget when the machine does not say how large its caches are.
const DEFAULT_BUDGET: usize = 4 << 20;
/// The budget is this fraction of the largest cache (see [`cache_budget`]).
const BUDGET_SHARE: usize = 8;

/// The destinations of the last [`WINDOW`] large copies (see the module notes).
#[derive(Debug)]
pub(crate) struct Footprint {
    /// (start address, length, the copy that last wrote there); unused slots have length 0.
    slots: [(usize, usize, u64); WINDOW],
    /// Large copies recorded so far.
    copies: u64,
}

impl Footprint {
    pub(crate) fn new() -> Footprint {
        Footprint { slots: [(0, 0, 0); WINDOW], copies: 0 }
    }

    /// Records a copy of `len` bytes to `start` and returns the bytes of the distinct
    /// destinations among the last [`WINDOW`] copies, this one included.
    pub(crate) fn record(&mut self, start: usize, len: usize) -> usize {
        self.copies = self.copies.wrapping_add(1);
        let stamp = self.copies;
        // The slot already at `start`, else the least recently written.
        let mut pick = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.0 == start && slot.1 > 0 {
                pick = i;
                break;
            }
            if slot.2 < self.slots[pick].2 {
                pick = i;
            }
        }
        self.slots[pick] = (start, len, stamp);
        // A slot is within the window if it was written by one of the last WINDOW copies.
        let oldest = stamp.saturating_sub(WINDOW as u64);
        self.slots.iter().filter(|s| s.2 > oldest).map(|s| s.1).fold(0, usize::saturating_add)
    }
}

/// An eighth of the largest CPU cache the machine reports (Linux sysfs), or 4 MiB if it
/// reports none.
///
/// An eighth, not the whole: the sources take as much room as the destinations, the
/// responder's own work and the requester's need some, and the last-level cache is shared
/// with every other core (and, in a VM, with other guests). Measured on the development VM
/// (32 MiB L3, alternating runs of brw write): with 4 MiB of destinations in play (1 MiB
/// RPCs, 4 in flight) ordinary copies were ahead, 16206–19500 against 15380–16539 MiB/s;
/// with 8 MiB (4 MiB RPCs, 2 in flight) streaming was, 23403–28661 against 15985–19740 MiB/s.
pub fn cache_budget() -> usize {
    largest_cache().map_or(DEFAULT_BUDGET, |c| c / BUDGET_SHARE)
}

/// The size of the largest cache in `/sys/devices/system/cpu/cpu0/cache`.
fn largest_cache() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| parse_size(&s))
        .max()
}

/// A sysfs cache size: `32768K`, `1M`, `512` (bytes).
fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let n: usize = digits.parse().ok()?;
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

/// Copies `len` bytes from `src` to `dst` with streaming stores, then fences them.
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LINE: usize = 64;
    // Ordinary stores up to the first cache line boundary of the destination, streaming
    // stores for whole lines, ordinary stores for the tail.
    let head = ((dst as usize).wrapping_neg() % LINE).min(len);
    // SAFETY: the first `head <= len` bytes of both ranges (the caller's promise).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut at = head;
    while len - at >= LINE {
        // SAFETY: `at + 64 <= len`: inside both ranges. The loads may be unaligned; the
        // stores are 16-byte aligned (`dst + at` is on a line boundary), as `_mm_stream_si128`
        // requires. SSE2 is part of x86-64.
        unsafe {
            let (s, d) = (src.add(at), dst.add(at));
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            _mm_stream_si128(d.cast::<__m128i>(), a);
            _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
        }
        at += LINE;
    }
    // SAFETY: the last `len - at` bytes of both ranges; then the fence orders every streaming
    // store before whatever the caller stores next.
    unsafe {
        std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at);
        _mm_sfence();
    }
}

/// Copies `len` bytes from `src` to `dst` (no streaming stores on this target; never called,
/// as [`AVAILABLE`] is false).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn stream_copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Every alignment of source and destination, lengths around the line size and long
    /// ones: every byte lands, nothing either side of the destination is touched.
    #[test]
    fn stream_copy_copies_exactly_the_range() {
        let mut rng = Rng::new(0x57_2ea3);
        let mut src = vec![0u8; 8192];
        rng.fill(&mut src);
        for len in [0, 1, 15, 63, 64, 65, 127, 128, 129, 1000, 4096, 5000] {
            for s_off in [0, 1, 7, 16, 63] {
                for d_off in [0, 1, 8, 17, 32, 63] {
                    let mut dst = vec![0xa5u8; 8192 + 256];
                    // SAFETY: both ranges inside their vectors (offsets < 64, len <= 5000).
                    unsafe { stream_copy(src[s_off..].as_ptr(), dst[64 + d_off..].as_mut_ptr(), len) };
                    let at = 64 + d_off;
                    assert_eq!(
                        &dst[at..at + len],
                        &src[s_off..s_off + len],
                        "len {len} src+{s_off} dst+{d_off}"
                    );
                    assert!(dst[..at].iter().all(|&b| b == 0xa5), "before: len {len} dst+{d_off}");
                    assert!(dst[at + len..].iter().all(|&b| b == 0xa5), "after: len {len} dst+{d_off}");
                }
            }
        }
    }

    /// Buffers reused in turn count once each; a burst of distinct buffers counts until it
    /// leaves the window; a longer run of one buffer brings the footprint back to it.
    #[test]
    fn the_footprint_counts_distinct_recent_destinations() {
        const MIB: usize = 1 << 20;
        let mut f = Footprint::new();
        // 8 buffers of 1 MiB in turn, as 8 RPCs in flight would.
        let mut last = 0;
        for i in 0..200 {
            last = f.record(0x1000_0000 + (i % 8) * MIB, MIB);
        }
        assert_eq!(last, 8 * MIB);
        // 32 of them.
        for i in 0..200 {
            last = f.record(0x4000_0000 + (i % 32) * MIB, MIB);
        }
        assert_eq!(last, 32 * MIB);
        // One buffer from now on: the others leave the window after WINDOW copies.
        for i in 0..WINDOW {
            last = f.record(0x7000_0000, 4 * MIB);
            if i + 1 < WINDOW - 32 {
                assert!(last > 4 * MIB, "copy {i}: {last}");
            }
        }
        assert_eq!(last, 4 * MIB);
        // A buffer that shrinks counts at its latest length.
        assert_eq!(f.record(0x7000_0000, MIB), MIB);
        // More distinct destinations than slots: at most WINDOW of them count.
        for i in 0..3 * WINDOW {
            last = f.record(0x9000_0000 + i * MIB, MIB);
        }
        assert_eq!(last, WINDOW * MIB);
    }

    #[test]
    fn sysfs_sizes_parse_and_odd_ones_are_refused() {
        assert_eq!(parse_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999999K"), None);
        assert!(cache_budget() >= 1 << 10, "a budget of at least a KiB");
    }

    #[test]
    fn settings_name_the_modes() {
        assert_eq!(Streaming::parse(None), Some(Streaming::Auto));
        assert_eq!(Streaming::parse(Some("auto")), Some(Streaming::Auto));
        assert_eq!(Streaming::parse(Some("")), Some(Streaming::Auto));
        assert_eq!(Streaming::parse(Some(" off ")), Some(Streaming::Off));
        assert_eq!(Streaming::parse(Some("0")), Some(Streaming::Off));
        assert_eq!(Streaming::parse(Some("always")), Some(Streaming::Always));
        assert_eq!(Streaming::parse(Some("allways")), None);
    }
}
