//! The transmit batch: consecutive frames to one destination gathered into one buffer and
//! sent as one UDP GSO `sendmsg` (or one frame at a time where the wire cannot).

use std::net::Ipv4Addr;

use super::MAX_FRAME;
use super::fault::FaultyWire;
use super::wire::{self, Wire};
use crate::time::Instant;

/// Frames waiting to go out as one GSO send: consecutive frames to one destination, all of
/// `seg` bytes except possibly the last. The buffer is allocated once at full size (a GSO batch
/// plus one frame) and reused without re-zeroing; `used` bytes of it are frames.
pub(super) struct TxBatch {
    pub(super) buf: Vec<u8>,
    pub(super) used: usize,
    pub(super) dst: Option<Ipv4Addr>,
    pub(super) seg: usize,
    pub(super) count: usize,
    /// A frame shorter than `seg` was added: nothing may follow it.
    pub(super) closed: bool,
    /// The frames are unsealed (their ICRC not computed: [`Wire::send_unsealed`]).
    pub(super) unsealed: bool,
}

impl Default for TxBatch {
    fn default() -> TxBatch {
        TxBatch {
            buf: vec![0u8; wire::MAX_GSO_BYTES + MAX_FRAME],
            used: 0,
            dst: None,
            seg: 0,
            count: 0,
            closed: false,
            unsealed: false,
        }
    }
}

impl TxBatch {
    /// A batch with no buffer, left in the device while `transmit` borrows the real one (so
    /// that borrowing it allocates and zero-fills nothing).
    pub(super) fn placeholder() -> TxBatch {
        TxBatch { buf: Vec::new(), used: 0, dst: None, seg: 0, count: 0, closed: false, unsealed: false }
    }

    pub(super) fn clear(&mut self) {
        self.used = 0;
        self.dst = None;
        self.seg = 0;
        self.count = 0;
        self.closed = false;
    }

    /// Whether a frame of `len` bytes to `dst`, written at `start` (`unsealed` or not), can
    /// join the batch.
    pub(super) fn fits(&self, dst: Ipv4Addr, len: usize, start: usize, unsealed: bool) -> bool {
        self.count == 0
            || (self.dst == Some(dst)
                && self.unsealed == unsealed
                && !self.closed
                && len <= self.seg
                && self.count < wire::MAX_GSO_SEGMENTS
                && start + len <= wire::MAX_GSO_BYTES)
    }

    pub(super) fn push(&mut self, dst: Ipv4Addr, len: usize, unsealed: bool) {
        if self.count == 0 {
            self.dst = Some(dst);
            self.seg = len;
            self.unsealed = unsealed;
        } else if len < self.seg {
            self.closed = true;
        }
        self.count += 1;
    }

    /// Sends the frames before byte `start` and moves the bytes after it to the front.
    pub(super) fn flush_before(
        &mut self,
        now: Instant,
        wire: &mut FaultyWire,
        start: usize,
    ) -> std::io::Result<()> {
        let r = match (self.dst, self.buf.get_mut(..start)) {
            (Some(dst), Some(frames)) if self.count > 0 && self.unsealed => {
                wire.send_unsealed(now, dst, frames, self.seg)
            }
            (Some(dst), Some(frames)) if self.count > 0 => {
                send_batch(now, wire, dst, frames, self.seg, self.count)
            }
            _ => Ok(()),
        };
        self.buf.copy_within(start..self.used, 0);
        self.used -= start;
        self.dst = None;
        self.seg = 0;
        self.count = 0;
        self.closed = false;
        self.unsealed = false;
        r
    }

    pub(super) fn flush_all(&mut self, now: Instant, wire: &mut FaultyWire) -> std::io::Result<()> {
        let r = self.flush_before(now, wire, self.used);
        self.clear();
        r
    }
}

pub(super) fn send_batch(
    now: Instant,
    wire: &mut FaultyWire,
    dst: Ipv4Addr,
    frames: &[u8],
    seg: usize,
    count: usize,
) -> std::io::Result<()> {
    if count == 1 { wire.send(now, dst, frames) } else { wire.send_segments(now, dst, frames, seg) }
}
