//! Reaping completion queues: event mode and polling mode.
//!
//! A connection's CQ is in one of two modes, as in any verbs consumer that busy-polls:
//! * **armed** (event mode): `req_notify` was called, and the next completion signals the CQ's
//!   completion channel (an fd the driver's poller watches; the software device writes an
//!   eventfd). The engine drains it when the driver reports the fd ([`Engine::cq_ready`]) or
//!   the device says it signalled it ([`Device::take_signalled_cqs`]), reads the notification,
//!   drains, re-arms and drains once more (a completion can land in between).
//! * **polled**: while the driver spins ([`Engine::set_cq_poll_window`]), a CQ that produced a
//!   completion within the window is left unarmed and drained on every [`Engine::poll`], with
//!   no notification, so no system call, per completion. A polled CQ that stays empty for the
//!   window is armed again; the driver arms every polled CQ before it sleeps
//!   ([`Engine::arm_cqs`]), so a sleeping scheduler is always woken by its CQs' fds.
//!
//! With a zero window (the default, and the simulations') every CQ is re-armed after each
//! drain, which is plain event mode.

use std::time::Duration;

use super::tx::{WrKind, parse_wr_id};
use super::{Engine, WC_BATCH};
use crate::fabric::{CompletionQueue, Device, WcStatus};
use crate::time::Instant;

impl<D: Device> Engine<D> {
    /// Keeps CQs that produced a completion within `window` unarmed and polls them on every
    /// [`Engine::poll`] (zero: event mode only). The driver passes its busy-poll time.
    pub fn set_cq_poll_window(&mut self, window: Duration) {
        self.cq_poll_window = window;
    }

    /// Arms every polled CQ and drains it once more (what came in before the arm would signal
    /// nothing). Called before the driver sleeps; true if that handled a completion, in which
    /// case there may be work to do and the driver should not sleep yet.
    pub fn arm_cqs(&mut self, now: Instant) -> bool {
        if self.polled.is_empty() {
            return false;
        }
        let before = self.work;
        let outer = std::mem::replace(&mut self.reaping, true);
        for key in std::mem::take(&mut self.polled) {
            if let Some(conn) = self.conns.get_mut(key).filter(|c| c.cq_polled) {
                conn.cq_polled = false;
                self.arm_cq(now, key);
                self.maybe_destroy(now, key);
            }
        }
        self.reaping = outer;
        self.work != before
    }

    /// CQs the device says it signalled during `progress`: reaped in this poll, without waiting
    /// for the driver's poller to report their fds.
    pub(super) fn take_signalled(&mut self) {
        self.dev.take_signalled_cqs(&mut self.signalled);
        for fd in self.signalled.drain(..) {
            if let Some(&key) = self.by_cq_fd.get(&fd) {
                self.cq_ready.push_back(key);
            }
        }
    }

    /// Drains the CQs that were signalled and those being polled.
    pub(super) fn reap_completions(&mut self, now: Instant) {
        // A list kept between polls: a spinning scheduler reaps on every turn.
        let mut keys = std::mem::take(&mut self.reap_keys);
        keys.clear();
        if self.poll_all_cqs {
            self.cq_ready.clear();
            keys.extend(self.conns.iter().map(|(k, _)| k));
        } else {
            keys.extend(self.cq_ready.drain(..));
        }
        keys.append(&mut self.polled);
        keys.sort_unstable();
        keys.dedup();
        for &key in &keys {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.cq_polled = false;
            }
            self.drain_cq(now, key);
        }
        self.reap_keys = keys;
    }

    /// Drains a CQ, then either keeps it polled or re-arms it and drains again.
    pub(super) fn drain_cq(&mut self, now: Instant, key: usize) {
        let outer = std::mem::replace(&mut self.reaping, true);
        self.drain_cq_inner(now, key);
        self.reaping = outer;
    }

    fn drain_cq_inner(&mut self, now: Instant, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        if conn.cq_armed {
            // The notification may have fired (it disarms the CQ): consume it.
            conn.cq_armed = false;
            let _ = conn.cq.get_event();
        }
        if self.poll_cq(now, key) > 0 {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.cq_busy = now;
            }
        }
        let window = self.cq_poll_window;
        match self.conns.get_mut(key) {
            None => return,
            Some(conn) if !window.is_zero() && now.saturating_duration_since(conn.cq_busy) < window => {
                if !conn.cq_polled {
                    conn.cq_polled = true;
                    self.polled.push(key);
                }
            }
            Some(_) => self.arm_cq(now, key),
        }
        self.maybe_destroy(now, key);
    }

    /// Arms the CQ and drains what arrived before the arm.
    fn arm_cq(&mut self, now: Instant, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        let _ = conn.cq.req_notify(false);
        conn.cq_armed = true;
        self.poll_cq(now, key);
    }

    /// Handles every completion on the CQ; returns how many.
    fn poll_cq(&mut self, now: Instant, key: usize) -> usize {
        let mut total = 0;
        loop {
            let mut wcs = std::mem::take(&mut self.wcs);
            let n = match self.conns.get(key) {
                Some(c) => c.cq.poll(&mut wcs),
                None => 0,
            };
            for wc in wcs.iter().take(n) {
                if self.defer_tx
                    && wc.status == WcStatus::Success
                    && matches!(parse_wr_id(wc.wr_id), Some((WrKind::Tx, ..)))
                {
                    self.deferred_tx.push(*wc);
                } else {
                    self.handle_deferred_tx(now);
                    self.handle_wc(now, *wc);
                }
            }
            self.wcs = wcs;
            total += n;
            if n < WC_BATCH {
                return total;
            }
        }
    }
}
