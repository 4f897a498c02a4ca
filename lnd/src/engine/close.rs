//! Closing (`kiblnd_close_conn`, `kiblnd_destroy_conn`) and shutdown: a closing connection
//! ends its queued and active transmits with the close error (those still posted end on their
//! flushes), is destroyed once every work request came back, and a peer left with no
//! connection and no attempt fails the transmits waiting for it.

use lnet_shim::event::Errno;
use lnet_shim::lnd::{Health, LndError};
use lnet_shim::nid::Nid;

use super::conn::ConnState;
use super::{Engine, FdChange, Waiting, ZOMBIE_GRACE, err};
use crate::fabric::{CompletionQueue, Device, QpModify, QueuePair};
use crate::time::Instant;

impl<D: Device> Engine<D> {
    /// Closes a connection (`kiblnd_close_conn`): every queued transmit and every active one
    /// not still sending completes now with `error`; the rest complete on their flushes. If it
    /// was a connection attempt and no other attempt is left, the peer's waiting transmits fail.
    pub(super) fn close_conn(&mut self, now: Instant, key: usize, error: LndError) {
        if let Some(peer) = self.close_conn_only(now, key, error) {
            self.fail_pending_if_unreachable(now, peer, error);
        }
    }

    /// [`Engine::close_conn`] without touching the peer's waiting transmits; returns the peer
    /// if the connection was still being set up (the caller decides: retry or fail them).
    pub(super) fn close_conn_only(&mut self, now: Instant, key: usize, error: LndError) -> Option<Nid> {
        if self.conns.get(key)?.state == ConnState::Closing {
            return None;
        }
        self.handle_deferred_tx(now);
        let conn = self.conns.get_mut(key)?;
        // Completions already on the CQ happened before whatever closes the connection (the
        // peer acknowledged our last send, or sent its last message, before its DREQ, but the
        // CQ's notification may not have been seen yet): reap them first, so that a send the
        // peer received completes as sent and a message it sent is delivered, not dropped as
        // a late arrival on a closing connection. Not when completions are being reaped.
        if conn.state == ConnState::Established && !self.reaping {
            self.drain_cq(now, key);
            if self.conns.get(key).is_none_or(|c| c.state == ConnState::Closing) {
                return None;
            }
        }
        let conn = self.conns.get_mut(key)?;
        let was_connecting = matches!(conn.state, ConnState::ActiveConnect | ConnState::PassiveWait);
        let was_active_connect = conn.state == ConnState::ActiveConnect;
        let was_passive = conn.state == ConnState::PassiveWait;
        conn.state = ConnState::Closing;
        conn.close_error = Some(error);
        conn.zombie_deadline = now + ZOMBIE_GRACE;
        conn.early_rx.clear();
        let _ = conn.qp.modify(&QpModify::Err);
        let queued = conn.credits.drain();
        let active = std::mem::take(&mut conn.active_txs);
        let peer = conn.peer;
        if let Some(id) = conn.cm_id {
            if self.cm.disconnect(now, id).is_err() {
                self.cm.destroy(now, id);
            }
        }
        self.stats.conns_closed += 1;
        for t in queued.into_iter().chain(active) {
            self.abort_tx(t, error);
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            if was_active_connect {
                p.connecting = p.connecting.saturating_sub(1);
            }
            if was_passive {
                p.accepting = p.accepting.saturating_sub(1);
            }
            p.last_error = Some(error);
        }
        self.maybe_destroy(now, key);
        was_connecting.then_some(peer)
    }

    /// A peer with no connection, no attempt left and no reconnect due fails the transmits
    /// waiting for it (`kiblnd_peer_connect_failed`); its next attempt is a fresh start, not a
    /// paced reconnect.
    pub(super) fn fail_pending_if_unreachable(&mut self, _now: Instant, peer: Nid, error: LndError) {
        let live = self.peers.get(&peer).is_some_and(|p| {
            p.connecting > 0
                || p.accepting > 0
                || p.reconnect_at.is_some()
                || super::conn::established(&self.conns, &p.conns).next().is_some()
        });
        if !live {
            if let Some(p) = self.peers.get_mut(&peer) {
                p.reconnects = 0;
            }
            self.fail_pending(peer, error);
        }
    }

    /// Fails every transmit waiting for a connection to `peer` with `error`.
    pub(super) fn fail_pending(&mut self, peer: Nid, error: LndError) {
        let pending: Vec<usize> =
            self.peers.get_mut(&peer).map(|p| p.pending.drain(..).collect()).unwrap_or_default();
        for t in pending {
            if let Some(tx) = self.txs.get_mut(t) {
                tx.queued = false;
                tx.fail(error);
            }
            self.tx_maybe_done(t);
        }
    }

    /// Destroys a closing connection once every work request came back.
    pub(super) fn maybe_destroy(&mut self, now: Instant, key: usize) {
        if self.conns.get(key).is_some_and(|c| c.state == ConnState::Closing && c.is_quiet()) {
            self.destroy_conn(now, key);
        }
    }

    /// Frees a connection's QP, CQ and buffers. Transmits still sending (the device never
    /// flushed them) complete with the close error.
    pub(super) fn destroy_conn(&mut self, _now: Instant, key: usize) {
        if !self.conns.contains(key) {
            return;
        }
        let conn = self.conns.remove(key);
        let error = conn.close_error.unwrap_or(err(Errno::ECONNABORTED, Health::LocalDropped));
        let stuck: Vec<usize> =
            self.txs.iter().filter(|(_, t)| t.conn == Some(key) && t.sending > 0).map(|(k, _)| k).collect();
        for t in stuck {
            if let Some(tx) = self.txs.get_mut(t) {
                tx.sending = 0;
                tx.conn = None;
                tx.fail(error);
            }
            self.tx_maybe_done(t);
        }
        // Transmits that finished already refer to no connection; clear dangling keys.
        for (_, t) in self.txs.iter_mut() {
            if t.conn == Some(key) {
                t.conn = None;
            }
        }
        self.by_qpn.remove(&conn.qp.qp_num());
        if let Some(id) = conn.cm_id {
            self.by_cm.remove(&id.0);
        }
        self.fd_changes.push(FdChange::Remove { fd: conn.cq.event_fd() });
        if self.by_cq_fd.get(&conn.cq.event_fd()) == Some(&key) {
            self.by_cq_fd.remove(&conn.cq.event_fd());
        }
        if let Some(p) = self.peers.get_mut(&conn.peer) {
            p.conns.retain(|&k| k != key);
        }
        drop(conn);
    }

    /// Closes every connection to `peer`; its pending sends fail.
    pub fn close_peer(&mut self, now: Instant, peer: Nid) {
        let keys: Vec<usize> = self.peers.get(&peer).map(|p| p.conns.clone()).unwrap_or_default();
        for k in keys {
            self.close_conn(now, k, err(Errno::ECONNABORTED, Health::LocalDropped));
        }
        self.fail_pending(peer, err(Errno::ECONNABORTED, Health::LocalDropped));
        // Closed on request, not failed.
        self.forget_failure(peer);
    }

    /// The peer's connections ended without a failure (a hang-up, a close on request): it is
    /// reported idle, not `Failed`, unless an attempt is under way or a connection is up.
    pub(super) fn forget_failure(&mut self, peer: Nid) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.last_error = None;
        }
    }

    /// Stops the interface: refuses new sends, fails everything pending, closes every
    /// connection. Call [`Engine::poll`] until [`Engine::is_idle`].
    pub fn shutdown(&mut self, now: Instant) {
        self.shutdown = true;
        self.cm.unlisten(self.service_id);
        let peers: Vec<Nid> = self.peers.keys().copied().collect();
        for p in peers {
            self.close_peer(now, p);
        }
        for w in std::mem::take(&mut self.waiting) {
            if let Waiting::Send(msg) = w {
                self.upcalls.send_done(msg.token, Err(err(Errno::ESHUTDOWN, Health::LocalDropped)));
            }
        }
    }

    /// Ends a shutdown that did not drain in time: destroys every connection at once (their
    /// transmits complete with their close errors) and fails whatever still waits.
    pub fn abandon(&mut self, now: Instant) {
        self.shutdown(now);
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.close_conn(now, k, err(Errno::ESHUTDOWN, Health::LocalDropped));
            self.destroy_conn(now, k);
        }
        let left: Vec<usize> = self.txs.iter().map(|(k, _)| k).collect();
        for t in left {
            if let Some(tx) = self.txs.get_mut(t) {
                tx.sending = 0;
            }
            self.abort_tx(t, err(Errno::ESHUTDOWN, Health::LocalDropped));
        }
    }

    /// Whether shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown
    }
}
