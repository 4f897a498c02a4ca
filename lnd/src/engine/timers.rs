//! Time-driven work: transmit deadlines (an expired transmit closes its whole connection,
//! o2iblnd-style), the periodic scan (keepalives, connect deadlines, zombie connections,
//! paced reconnects) and the sends and receives that waited for a free descriptor.

use lnet_shim::event::Errno;
use lnet_shim::lnd::Health;
use lnet_shim::nid::Nid;

use super::conn::ConnState;
use super::{Engine, Waiting, err};
use crate::fabric::Device;
use crate::time::Instant;

impl<D: Device> Engine<D> {
    /// Checks deadlines of transmits (queued, active, or waiting for a connection), once the
    /// earliest may have passed: every transmit is looked at, those due expire in deadline
    /// order, and the earliest deadline left is the next check.
    pub(super) fn expire(&mut self, now: Instant) {
        if self.tx_check.is_none_or(|t| t > now) {
            return;
        }
        let mut due = Vec::new();
        let mut next = None;
        for (key, tx) in self.txs.iter() {
            if tx.deadline <= now {
                due.push((tx.deadline, key, tx.generation));
            } else {
                next = Instant::min_deadline(next, Some(tx.deadline));
            }
        }
        self.tx_check = next;
        due.sort_unstable();
        for (t, key, generation) in due {
            // Still the same transmit with the same deadline (an earlier expiry may have
            // ended it, or moved it to another connection with a new deadline).
            let Some(tx) = self.txs.get_mut(key).filter(|tx| tx.generation == generation && tx.deadline == t)
            else {
                continue;
            };
            // Expired once: it does not expire again unless a new deadline is armed.
            tx.deadline = Instant::FAR_FUTURE;
            let tx = &*tx;
            self.stats.tx_timeouts += 1;
            match tx.conn {
                // o2iblnd: any expired transmit closes the whole connection.
                Some(c) => {
                    let health = if tx.sending > 0 || tx.waiting {
                        Health::RemoteTimeout
                    } else {
                        Health::LocalTimeout
                    };
                    self.close_conn(now, c, err(Errno::ETIMEDOUT, health));
                }
                None => {
                    let peer = tx.peer;
                    if let Some(p) = self.peers.get_mut(&peer) {
                        p.pending.retain(|&k| k != key);
                    }
                    self.abort_tx(key, err(Errno::ETIMEDOUT, Health::NetworkTimeout));
                }
            }
        }
    }

    /// Periodic work: keepalives, connect deadlines, zombie connections, due reconnects.
    pub(super) fn scan(&mut self, now: Instant) {
        let keepalive = self.cfg.tunables.keepalive_interval();
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            let Some(c) = self.conns.get(key) else { continue };
            match c.state {
                ConnState::Established => {
                    if keepalive.is_some_and(|ka| now >= c.last_send + ka) {
                        self.dirty.insert(key);
                    }
                }
                ConnState::ActiveConnect | ConnState::PassiveWait => {
                    if now >= c.connect_deadline {
                        self.connect_failed(now, key, err(Errno::ETIMEDOUT, Health::NetworkTimeout));
                    }
                }
                ConnState::Closing => {
                    if now >= c.zombie_deadline {
                        self.destroy_conn(now, key);
                    } else {
                        self.maybe_destroy(now, key);
                    }
                }
            }
        }
        self.reconnect_due(now);
    }

    /// Peers whose reconnect after a reject is due (connd taking `kib_reconn_list`, and
    /// `kib_reconn_wait` once a second): connected again if transmits still wait for them and
    /// nothing else is under way. Otherwise the reconnect is dropped (`kiblnd_reconnect_peer`
    /// aborting, `kiblnd_check_reconnect`'s "no need": the waiting transmits expired or went
    /// elsewhere), and a peer nothing waits for starts afresh next time. Also connects a peer
    /// whose transmits wait with nothing under way for them at all.
    pub(super) fn reconnect_due(&mut self, now: Instant) {
        let mut due: Vec<Nid> = Vec::new();
        let mut next = None;
        for (nid, p) in &mut self.peers {
            if let Some(t) = p.reconnect_at.filter(|&t| t > now) {
                next = Instant::min_deadline(next, Some(t));
                continue;
            }
            let open =
                p.conns.iter().any(|&k| self.conns.get(k).is_some_and(|c| c.state != ConnState::Closing));
            let busy = p.connecting > 0 || p.accepting > 0 || open;
            if !busy && !p.pending.is_empty() {
                due.push(*nid);
            } else if p.reconnect_at.take().is_some() && !busy {
                p.reconnects = 0;
            }
        }
        self.reconnect_check = next;
        for nid in due {
            self.connect_peer(now, nid);
        }
    }

    /// Sends and replies that waited for a free descriptor. Replies to received requests go
    /// first and may use the last descriptors: they finish without needing another one, so
    /// they always free what they take. New sends leave [`Engine::reply_reserve`] descriptors
    /// free; otherwise two peers whose pools are full of requests waiting for each other's
    /// replies would wait forever.
    pub(super) fn retry_waiting(&mut self, now: Instant) {
        while self.slots.available() > 0 {
            let Some(pos) = self.waiting.iter().position(|w| matches!(w, Waiting::Rx(..))) else { break };
            if let Some(Waiting::Rx(key, generation, rx, len)) = self.waiting.remove(pos) {
                self.retry_rx(now, key, generation, rx, len);
            }
        }
        while self.slots.available() > self.reply_reserve() {
            let Some(w) = self.waiting.pop_front() else { break };
            match w {
                Waiting::Send(msg) => self.launch_now(now, msg),
                Waiting::Rx(key, generation, rx, len) => self.retry_rx(now, key, generation, rx, len),
            }
        }
    }

    pub(super) fn retry_rx(&mut self, now: Instant, key: usize, generation: u32, rx: u32, len: u32) {
        if self
            .conns
            .get(key)
            .is_some_and(|c| c.generation == generation && c.state == ConnState::Established)
        {
            self.handle_rx(now, key, rx, len);
        }
    }

    /// Descriptors new sends leave for replies to received requests.
    pub(super) fn reply_reserve(&self) -> usize {
        (self.slots.total() as usize / 8).max(2)
    }
}
