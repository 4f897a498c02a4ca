//! `ring`: the consumer of a same-host frame ring (`lnd::fabric::soft::ring`) against a
//! hostile producer.
//!
//! The input sets the ring's `head` and `tail` words and the bytes of its data area (from the
//! head's position on, wrapping) and picks the receive buffer's size; the consumer then takes
//! frames until the ring is empty or refused (see `ring::consume_hostile`).
//!
//! Checked: every frame taken fits the buffer and a record (16 KiB); the frames and their
//! 8-byte record headers never add up to more than the producer claimed to have written
//! (`tail - head`), so the consumer never reads past what was published.

use lnd::fabric::soft::ring::{HOSTILE_CAPACITY, consume_hostile};

/// Largest frame a record holds.
const MAX_RECORD: usize = 16 << 10;

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some(c) = consume_hostile(data) else { return };
    let word = |at: usize| data.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    let published = word(9).wrapping_sub(word(1));
    let mut used = 0u64;
    for &n in &c.frames {
        assert!(n <= c.buf_len && n <= MAX_RECORD, "frame of {n} bytes, buffer {}", c.buf_len);
        used += 8 + n.div_ceil(8) as u64 * 8;
    }
    // Wrap markers skip to the ring's end, so allow one capacity of them.
    assert!(
        used <= published.min(HOSTILE_CAPACITY as u64) + HOSTILE_CAPACITY as u64 || c.frames.is_empty(),
        "took {used} bytes of records, {published} published"
    );
}
