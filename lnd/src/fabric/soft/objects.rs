//! The verbs objects a [`SoftDevice`] hands out: protection domains, memory regions and RC
//! queue pairs. Each holds the device's shared state; posting takes the device lock, queues
//! the work and returns (the device's `progress` does the rest), and dropping one destroys it
//! in the device's tables.

use std::sync::Arc;

use super::wire::Wire;
use super::{DevState, QpEntry, Shared};
use crate::fabric::{
    Access, FabricError, MemoryRegion, ProtectionDomain, QpCaps, QpModify, QpState, QueuePair, RecvWr, SendWr,
};
use crate::time::Instant;

/// A protection domain of the software device.
pub struct SoftPd {
    pub(super) shared: Arc<Shared>,
    pub(super) handle: u32,
}

impl std::fmt::Debug for SoftPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftPd({})", self.handle)
    }
}

impl ProtectionDomain for SoftPd {
    fn handle(&self) -> u32 {
        self.handle
    }
}

impl Drop for SoftPd {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.pds = s.pds.saturating_sub(1);
    }
}

/// A registered memory region of the software device; dropping it deregisters.
pub struct SoftMr {
    pub(super) shared: Arc<Shared>,
    pub(super) key: u32,
    pub(super) addr: u64,
    pub(super) len: usize,
    pub(super) access: Access,
}

impl std::fmt::Debug for SoftMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftMr(key {:#x}, {:#x}+{})", self.key, self.addr, self.len)
    }
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> Access {
        self.access
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        // A running copy that writes into this memory lands first; one into other memory runs
        // on (a region registered for one transfer is dropped while others' copies run).
        s.place.drain_into(self.addr, self.len as u64);
        s.mrs.deregister(self.key);
    }
}

/// An RC queue pair of the software device; dropping it destroys the QP.
pub struct SoftQp {
    pub(super) shared: Arc<Shared>,
    pub(super) qpn: u32,
    pub(super) caps: QpCaps,
}

impl std::fmt::Debug for SoftQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SoftQp({:#x})", self.qpn)
    }
}

impl SoftQp {
    /// Runs `f` on the QP's entry and the rest of the device, then hands out what it produced
    /// (completions, events, frames to send), all under one hold of the device lock.
    fn with<R>(&self, f: impl FnOnce(&mut DevState, &mut QpEntry) -> R) -> Result<R, FabricError> {
        let mut s = self.shared.lock();
        let mut e = s.qps.remove(&self.qpn).ok_or(FabricError::NotFound { what: "queue pair" })?;
        let r = f(&mut s, &mut e);
        s.qps.insert(self.qpn, e);
        s.after_qp(self.qpn, None);
        Ok(r)
    }

    /// As [`SoftQp::with`] for posting receives: the entry stays in its table, and the QP is
    /// looked at afterwards only if the posting made completions (a QP in ERR flushes what is
    /// posted). A receive gives the transport nothing to send and no timer, so the QP is not
    /// queued to transmit for it (after a reply posted just before, that was a pass of
    /// `transmit` finding nothing).
    fn with_receive_queue<R>(&self, f: impl FnOnce(&mut QpEntry) -> R) -> Result<R, FabricError> {
        let mut s = self.shared.lock();
        let e = s.qps.get_mut(&self.qpn).ok_or(FabricError::NotFound { what: "queue pair" })?;
        let r = f(e);
        if e.rc.has_completions() {
            s.after_qp(self.qpn, None);
        }
        Ok(r)
    }

    /// `post_send`, and with `now` the doorbell of `post_send_at`.
    fn post_sends(&self, wrs: &[SendWr<'_>], now: Option<Instant>) -> Result<(), FabricError> {
        let mut s = self.shared.lock();
        let DevState { qps, mrs, .. } = &mut *s;
        let e = qps.get_mut(&self.qpn).ok_or(FabricError::NotFound { what: "queue pair" })?;
        let posted = wrs.iter().enumerate().try_for_each(|(index, wr)| {
            e.rc.post_send(wr, mrs).map_err(|reason| FabricError::Post { index, reason })
        });
        let dest = e.rc.dest_ip();
        s.after_qp(self.qpn, None);
        if let Some(now) = now.filter(|_| dest.is_some_and(|d| s.wire.immediate_route(d))) {
            let _ = s.transmit(now, self.shared.ip, self.shared.udp_port, false);
        }
        posted
    }
}

impl QueuePair for SoftQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn state(&self) -> QpState {
        self.shared.lock().qps.get(&self.qpn).map_or(QpState::Err, |e| e.rc.state())
    }

    fn modify(&self, m: &QpModify) -> Result<(), FabricError> {
        if let QpModify::Init { port_num, .. } = *m {
            if port_num != self.shared.port.port_num {
                return Err(FabricError::InvalidArgument { what: "port_num (not this device's port)" });
            }
        }
        self.with(|s, e| {
            let r = e.rc.modify(m);
            if r.is_ok() && matches!(m, QpModify::Rtr { .. }) {
                let nonce = e.rc.dest_ip().and_then(|ip| s.place.route(&s.wire, ip));
                e.rc.set_place(nonce);
            }
            r
        })?
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), FabricError> {
        self.post_sends(wrs, None)
    }

    /// The doorbell: when the QP's destination is reached through a same-host ring (no system
    /// call per frame, so nothing to batch), the device transmits now, under the same lock,
    /// instead of at the caller's next `progress`: what was posted, with the ACKs waiting
    /// riding on it (and whatever else is ready to go, as `progress` would).
    /// Elsewhere (UDP, where frames are batched into one system call, or faults on) it is
    /// `post_send`. Transmit errors are left to the next `progress` (a lost frame is
    /// retransmitted): the work requests are posted either way.
    fn post_send_at(&self, wrs: &[SendWr<'_>], now: Instant) -> Result<(), FabricError> {
        self.post_sends(wrs, Some(now))
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), FabricError> {
        self.with_receive_queue(|e| {
            for (index, wr) in wrs.iter().enumerate() {
                e.rc.post_recv(wr).map_err(|reason| FabricError::Post { index, reason })?;
            }
            Ok(())
        })?
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        if let Some(e) = s.qps.remove(&self.qpn) {
            s.wqe_used = s.wqe_used.saturating_sub(e.wqes);
        }
    }
}
