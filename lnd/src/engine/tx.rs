//! Transmit descriptors (`kib_tx`), their message-buffer pool, and work-request ids.
//!
//! A [`Tx`] is one o2iblnd message in flight plus what it waits for: `sending` counts its posted
//! signaled SENDs not yet completed, `waiting` says a reply from the peer is still due (PUT_ACK or
//! PUT_NAK for a PUT_REQ, GET_DONE for a GET_REQ, PUT_DONE for a PUT_ACK), `queued` that it sits
//! on a queue. It is finished, and reported upward exactly once, when all three are clear.
//!
//! Work-request ids carry a kind, a generation and an index, so a completion for a descriptor
//! that has since been reused, or for a connection that has been destroyed, is recognised as
//! stale and ignored.

use lnet_shim::lnd::{Frags, LndError};
use lnet_shim::nid::Nid;

use crate::credits::TxClass;
use crate::fabric::Sge;
use crate::time::Instant;
use crate::wire::MsgType;

/// Work-request kinds (o2iblnd's `IBLND_WID_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WrKind {
    /// The signaled SEND of a transmit.
    Tx,
    /// A posted receive buffer.
    Rx,
    /// An unsignaled RDMA WRITE (completes only on error).
    Rdma,
}

/// Packs a work-request id: 2 bits of kind, 30 bits of generation, 32 bits of index.
pub(crate) fn wr_id(kind: WrKind, generation: u32, index: u32) -> u64 {
    let k: u64 = match kind {
        WrKind::Tx => 1,
        WrKind::Rx => 2,
        WrKind::Rdma => 3,
    };
    (k << 62) | (u64::from(generation & 0x3fff_ffff) << 32) | u64::from(index)
}

/// Unpacks a work-request id; `None` for ids this engine never makes.
pub(crate) fn parse_wr_id(id: u64) -> Option<(WrKind, u32, u32)> {
    let kind = match id >> 62 {
        1 => WrKind::Tx,
        2 => WrKind::Rx,
        3 => WrKind::Rdma,
        _ => return None,
    };
    Some((kind, ((id >> 32) & 0x3fff_ffff) as u32, id as u32))
}

/// Receive work-request index: connection key and receive-buffer number.
pub(crate) fn rx_index(conn: usize, rx: u32) -> u32 {
    ((conn as u32) << 16) | (rx & 0xffff)
}

/// Inverse of [`rx_index`].
pub(crate) fn split_rx_index(index: u32) -> (usize, u32) {
    ((index >> 16) as usize, index & 0xffff)
}

/// Largest connection key that fits a receive work-request id.
pub(crate) const MAX_CONN_KEY: usize = 0xffff;

/// What to tell LNet when a transmit finishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upper {
    /// Nothing (NOOP, PUT_NAK, a completion whose receive was already reported).
    None,
    /// `send_done(token)`.
    Send(u64),
    /// `recv_done(token)`: the transmit finishes a receive (PUT_ACK waits for PUT_DONE;
    /// GET_DONE sends the reply).
    Recv(u64),
}

/// One RDMA WRITE work request: where it lands and what it gathers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RdmaWr {
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) sges: Vec<Sge>,
}

/// One message in flight.
#[derive(Debug)]
pub(crate) struct Tx {
    pub(crate) generation: u32,
    /// Message-buffer slot in the pool.
    pub(crate) slot: u32,
    pub(crate) peer: Nid,
    /// The connection it is queued or active on.
    pub(crate) conn: Option<usize>,
    pub(crate) msg_type: MsgType,
    /// Bytes of the message (header + body) written in the slot.
    pub(crate) nob: u32,
    pub(crate) class: TxClass,
    pub(crate) noop: bool,
    pub(crate) queued: bool,
    pub(crate) sending: u32,
    pub(crate) waiting: bool,
    /// The peer answered it (PUT_NAK, PUT_DONE or GET_DONE arrived): it received our message,
    /// so a later flush of our SEND, or the connection closing, cannot fail the exchange.
    pub(crate) answered: bool,
    /// Bytes moved (for the upper layer) or why it failed.
    pub(crate) status: Result<usize, LndError>,
    /// For a GET_REQ: the reply length from GET_DONE.
    pub(crate) reply_len: Option<usize>,
    /// Cookie replies name this transmit by (0 = none).
    pub(crate) cookie: u64,
    pub(crate) deadline: Instant,
    pub(crate) upper: Upper,
    /// Local memory a PUT's data comes from (used when the PUT_ACK arrives).
    pub(crate) source: Vec<Sge>,
    /// RDMA WRITEs to post before the SEND.
    pub(crate) rdma: Vec<RdmaWr>,
    /// The sink's registration for this transfer alone (`fmr_cache=0`): deregistered when
    /// the transmit finishes, before the upper layer is told.
    pub(crate) sink_reg: Option<super::sink::TransferReg>,
    /// Buffers the transfer uses, kept alive until the transmit finishes.
    pub(crate) pinned: Frags,
}

impl Tx {
    /// Whether nothing keeps the transmit alive any more.
    pub(crate) fn is_finished(&self) -> bool {
        self.sending == 0 && !self.waiting && !self.queued
    }

    /// Records a failure unless an earlier one is already recorded, or the peer has already
    /// answered (its answer is the outcome).
    pub(crate) fn fail(&mut self, err: LndError) {
        if self.status.is_ok() && !self.answered {
            self.status = Err(err);
        }
    }
}

/// Message buffers: `ntx` slots of 4 KiB in one registered region.
#[derive(Debug)]
pub(crate) struct SlotPool {
    free: Vec<u32>,
    total: u32,
}

impl SlotPool {
    pub(crate) fn new(total: u32) -> SlotPool {
        SlotPool { free: (0..total).rev().collect(), total }
    }

    pub(crate) fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub(crate) fn give(&mut self, slot: u32) {
        debug_assert!(slot < self.total && !self.free.contains(&slot));
        self.free.push(slot);
    }

    pub(crate) fn available(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn total(&self) -> u32 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip_and_foreign_ids_are_refused() {
        for kind in [WrKind::Tx, WrKind::Rx, WrKind::Rdma] {
            let id = wr_id(kind, 0x3fff_ffff, u32::MAX);
            assert_eq!(parse_wr_id(id), Some((kind, 0x3fff_ffff, u32::MAX)));
        }
        assert_eq!(parse_wr_id(7), None);
        assert_eq!(split_rx_index(rx_index(MAX_CONN_KEY, 513)), (MAX_CONN_KEY, 513));
    }

    #[test]
    fn slot_pool_hands_out_each_slot_once() {
        let mut p = SlotPool::new(3);
        let a: Vec<_> = (0..3).filter_map(|_| p.take()).collect();
        assert_eq!(a, [0, 1, 2]);
        assert_eq!(p.take(), None);
        p.give(1);
        assert_eq!((p.available(), p.take()), (1, Some(1)));
    }
}
