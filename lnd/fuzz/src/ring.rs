//! `ring`: the consumer of a same-host frame ring (`lnd::fabric::soft::ring`) against a
//! hostile producer.
//!
//! The input sets the ring's `head` and `tail` words (the consumer reads only `head`) and the
//! bytes of its data area (from the head's position on, wrapping) and picks the receive
//! buffer's size; the consumer then takes frames until the ring is empty or refused (see
//! `ring::consume_hostile`).
//!
//! Checked: every frame taken fits the buffer and a record (16 KiB), and the consumer takes
//! no more records than the ring has stamp words: a record is there only when the stamp word
//! at its start names its own ring position, positions only grow, so each stamp word can
//! publish one record at most (stale bytes never pass for a record).

use lnd::fabric::soft::ring::{HOSTILE_CAPACITY, consume_hostile};

/// Largest frame a record holds.
const MAX_RECORD: usize = 16 << 10;
/// Bytes of a record's header, and its alignment.
const REC_HDR: usize = 16;

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some(c) = consume_hostile(data) else { return };
    for &n in &c.frames {
        assert!(n <= c.buf_len && n <= MAX_RECORD, "frame of {n} bytes, buffer {}", c.buf_len);
    }
    assert!(
        c.frames.len() <= HOSTILE_CAPACITY / REC_HDR,
        "took {} records from a ring of {} stamp words",
        c.frames.len(),
        HOSTILE_CAPACITY / REC_HDR
    );
}
