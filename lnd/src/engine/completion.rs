//! Work completions and the end of a transmit: each completion the CQs give back (and each
//! asynchronous device event) is matched to its receive buffer or transmit by its `wr_id`'s
//! kind and generation (a stale one, from a connection already gone, is counted and dropped),
//! and a transmit nothing holds any more is reported upward exactly once and its descriptor
//! freed.

use lnet_shim::event::Errno;
use lnet_shim::lnd::{Health, LndError, SendStatus};

use super::conn::ConnState;
use super::tx::{Tx, Upper, WrKind, parse_wr_id, split_rx_index};
use super::{Engine, err};
use crate::fabric::{AsyncEvent, CompletionQueue, Device, Wc, WcStatus};
use crate::time::Instant;

impl<D: Device> Engine<D> {
    pub(super) fn handle_async(&mut self, now: Instant, ev: AsyncEvent) {
        match ev {
            AsyncEvent::CommEst { qp_num } => {
                if let Some(&key) = self.by_qpn.get(&qp_num) {
                    if let Some(id) = self.conns.get(key).and_then(|c| c.cm_id) {
                        self.cm.notify_comm_est(now, id);
                    }
                }
            }
            AsyncEvent::QpFatal { qp_num } => {
                if let Some(&key) = self.by_qpn.get(&qp_num) {
                    self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
                }
            }
            AsyncEvent::CqErr { cq_id } => {
                let keys: Vec<usize> =
                    self.conns.iter().filter(|(_, c)| c.cq.id() == cq_id).map(|(k, _)| k).collect();
                for key in keys {
                    self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
                }
            }
            AsyncEvent::PortErr => self.port_down(now),
            AsyncEvent::PortActive => self.port_up(),
            AsyncEvent::DeviceFatal => self.device_fatal(now),
        }
    }

    pub(super) fn handle_wc(&mut self, now: Instant, wc: Wc) {
        self.work += 1;
        let Some((kind, generation, index)) = parse_wr_id(wc.wr_id) else {
            self.stats.stale_completions += 1;
            return;
        };
        match kind {
            WrKind::Rx => self.rx_completion(now, generation, index, wc),
            WrKind::Tx => self.tx_completion(now, generation, index as usize, wc),
            WrKind::Rdma => {
                // Unsignaled: only failures arrive, and the SEND behind the WRITE fails too.
                if wc.status != WcStatus::WrFlushErr && wc.status != WcStatus::Success {
                    if let Some(c) = self
                        .txs
                        .get(index as usize)
                        .filter(|t| t.generation == generation)
                        .and_then(|t| t.conn)
                    {
                        self.close_conn(now, c, err(Errno::EIO, Health::RemoteDropped));
                    }
                }
            }
        }
    }

    pub(super) fn rx_completion(&mut self, now: Instant, generation: u32, index: u32, wc: Wc) {
        let (key, rx) = split_rx_index(index);
        let Some(conn) = self.conns.get_mut(key).filter(|c| c.generation == generation) else {
            self.stats.stale_completions += 1;
            return;
        };
        conn.posted_rx = conn.posted_rx.saturating_sub(1);
        if wc.status != WcStatus::Success {
            if conn.state != ConnState::Closing {
                self.close_conn(now, key, err(Errno::EIO, Health::RemoteDropped));
            }
            return;
        }
        match conn.state {
            ConnState::Established => self.handle_rx(now, key, rx, wc.byte_len),
            ConnState::ActiveConnect => conn.early_rx.push((rx, wc.byte_len)),
            ConnState::PassiveWait => {
                // Only the peer that got our REP knows this QP's number and PSN: its message
                // stands for the RTU, as COMM_EST does (`rdma_notify`). Without that, a lost
                // RTU (every retry of it) would fail the accept while the peer, established,
                // had its sends acknowledged, and these receives would be lost.
                conn.early_rx.push((rx, wc.byte_len));
                if let Some(id) = conn.cm_id {
                    self.cm.notify_comm_est(now, id);
                }
            }
            ConnState::Closing => {}
        }
    }

    pub(super) fn tx_completion(&mut self, now: Instant, generation: u32, key: usize, wc: Wc) {
        let Some(tx) = self.txs.get_mut(key).filter(|t| t.generation == generation) else {
            self.stats.stale_completions += 1;
            return;
        };
        tx.sending = tx.sending.saturating_sub(1);
        let noop = tx.noop;
        let conn_key = tx.conn;
        let failed = wc.status != WcStatus::Success;
        if failed {
            tx.fail(err(Errno::EIO, Health::RemoteDropped));
        }
        if let Some(c) = conn_key.and_then(|k| self.conns.get_mut(k)) {
            c.sending = c.sending.saturating_sub(1);
            c.credits.send_completed(noop);
        }
        if let Some(c) = conn_key {
            if failed {
                self.close_conn(now, c, err(Errno::EIO, Health::RemoteDropped));
            } else {
                self.dirty.insert(c);
            }
        }
        self.tx_maybe_done(key);
        // Outside a drain (a deferred completion, `handle_deferred_tx`), nothing else looks
        // at whether a closing connection has now gone quiet.
        if let Some(c) = conn_key.filter(|_| !self.reaping) {
            self.maybe_destroy(now, c);
        }
    }

    /// Finishes a transmit if nothing holds it any more: reports upward, frees its slot.
    pub(super) fn tx_maybe_done(&mut self, key: usize) {
        let finished = self.txs.get(key).is_some_and(Tx::is_finished);
        if !finished {
            return;
        }
        let mut tx = self.txs.remove(key);
        // The peer's access to the sink ends with the transfer, before LNet may reuse it.
        drop(tx.sink_reg.take());
        if self.txs.is_empty() {
            // Nothing left to expire: no wake-up for deadlines of transmits already gone.
            self.tx_check = None;
        }
        self.slots.give(tx.slot);
        if tx.cookie != 0 && self.cookies.get(&tx.cookie) == Some(&key) {
            self.cookies.remove(&tx.cookie);
        }
        if let Some(c) = tx.conn.and_then(|k| self.conns.get_mut(k)) {
            c.active_txs.retain(|&t| t != key);
        }
        // A descriptor is free: every connection that could not get one for its NOOP tries
        // again, whichever connection this transmit was on (else a receive-only connection
        // would keep its peer's credits until the keepalive, after the peer's sends expired).
        for k in std::mem::take(&mut self.noop_starved) {
            if let Some(c) = self.conns.get_mut(k) {
                c.noop_starved = false;
                self.dirty.insert(k);
            }
        }
        match tx.upper {
            Upper::None => {}
            Upper::Send(token) => {
                if tx.status.is_err() {
                    self.stats.send_errors += 1;
                }
                self.upcalls.send_done(token, tx.status.map(|_| SendStatus { reply_len: tx.reply_len }));
            }
            Upper::Recv(token) => self.upcalls.recv_done(token, tx.status),
        }
    }

    /// Ends a transmit with `error`: it leaves every queue and stops waiting for the peer; it
    /// is reported now unless a posted send must still come back (its flush reports it).
    pub(super) fn abort_tx(&mut self, txk: usize, error: LndError) {
        if let Some(tx) = self.txs.get_mut(txk) {
            tx.queued = false;
            tx.waiting = false;
            tx.fail(error);
        }
        self.tx_maybe_done(txk);
    }
}
