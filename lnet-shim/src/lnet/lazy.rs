//! Lazy portals (`LNetSetLazyPortal`, `LNetClearLazyPortal`): a PUT that matches nothing on a
//! lazy portal waits for a match entry instead of being dropped.
//!
//! A server posts its request buffers on a portal and re-posts them as they are used; on a
//! lazy portal a request that finds every buffer in use, or that arrives before the first is
//! posted, is kept and matched when the next one is attached, as Lustre's services rely on.
//!
//! # The contract
//! * **What waits.** Only PUTs, and only those that match no entry (`DropReason::NoMatch`): a
//!   GET on a lazy portal that matches nothing is dropped, as in LNet, and so is a PUT that an
//!   MD refuses for its length. A waiting PUT is matched again, oldest first, whenever an MD
//!   is attached on its portal ([`super::Lnet::md_attach`], [`super::Lnet::attach`]): a match
//!   delivers it as if it had just arrived (PUT event, ACK), one that an MD refuses for its
//!   length is dropped, and one that still matches nothing waits on.
//! * **Where it waits.** LNet takes the PUT's payload at once into its own buffer (for an
//!   IMMEDIATE message a copy out of the LND's receive buffer; for an RDMA PUT the LND writes
//!   it there as into any sink), so the LND finishes the message as usual and its receive
//!   buffer and credit go back to the peer. When the PUT matches, the payload is copied into
//!   the MD. Kernel LNet instead leaves the message in the LND (o2iblnd keeps the receive
//!   buffer, so its credit returns only then and a peer that keeps sending runs out of
//!   credits): here the initiator of an RDMA PUT sees its PUT complete once the data is in
//!   LNet's buffer, and only its ACK, if it asked for one, waits for the match.
//! * **How much waits.** At most [`super::LnetConfig::lazy_max_bytes`] of payload at once, over
//!   all lazy portals (LNet itself has no such bound; its bound is the LNDs' credits). A PUT
//!   that would pass it is dropped and counted (`DropCounts::lazy_full`), with lnet-shim's drop
//!   NAK if it is an IMMEDIATE PUT that asked for an ACK.
//! * **Ending.** [`super::Lnet::clear_lazy_portal`] drops the PUTs waiting on the portal
//!   (`DropCounts::lazy_discarded`; an initiator waiting for an ACK gets the drop NAK), and
//!   a PUT whose data is still arriving when its portal is cleared is dropped when it is in.
//!   Shutdown drops whatever waits. A waiting PUT is not a message in progress
//!   ([`super::Lnet::wait_quiet`] does not wait for it); [`LazyStats`] counts them.

use std::collections::VecDeque;
use std::sync::Arc;

use super::recv::{DropWhy, Parsed};
use super::{MsgKind, Phase, State, Work};
use crate::buffer::Buffer;
use crate::event::Errno;
use crate::hash::FastMap;
use crate::hdr::{LnetHdr, PutMsg};
use crate::lnd::{Frag, Frags, Health, LndError};
use crate::matching::{DropReason, MatchError, MatchResult, Matched};
use crate::nid::Nid;

/// The default [`super::LnetConfig::lazy_max_bytes`]: 64 MiB.
pub const DEFAULT_LAZY_MAX_BYTES: u64 = 64 << 20;

/// Lazy portals' counters, in [`super::LnetStats::lazy`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LazyStats {
    /// Portals that are lazy now.
    pub portals: usize,
    /// PUTs waiting for a match entry now (their data in, or still arriving).
    pub waiting: usize,
    /// Their payload bytes.
    pub waiting_bytes: u64,
    /// PUTs that have had to wait, since LNet started.
    pub delayed: u64,
    /// Of those, the ones a match entry took later.
    pub resumed: u64,
}

/// A PUT waiting on a lazy portal.
struct Delayed {
    /// Its number, the key of its [`MsgKind::RecvDelayed`] while its data arrives.
    id: u64,
    /// The NI and LND peer it came from.
    ni: usize,
    from: Nid,
    hdr: LnetHdr,
    put: PutMsg,
    /// Its payload (`hdr.payload_length` bytes).
    data: Arc<Buffer>,
    /// Whether the payload is in (an RDMA PUT's is written by the LND after the match).
    ready: bool,
}

impl Delayed {
    fn len(&self) -> u64 {
        u64::from(self.hdr.payload_length)
    }
}

/// One portal's lazy state.
#[derive(Default)]
struct Portal {
    /// Whether the portal is lazy (a cleared one stays here while PUTs still arrive into it).
    lazy: bool,
    /// Its waiting PUTs, oldest first.
    waiting: VecDeque<Delayed>,
}

/// The lazy portals of an LNet and the PUTs waiting on them.
pub(super) struct Lazy {
    portals: FastMap<u32, Portal>,
    /// Waiting PUTs, over all portals.
    waiting: usize,
    /// Payload bytes of every waiting PUT.
    bytes: u64,
    /// The most `bytes` may reach.
    max_bytes: u64,
    next_id: u64,
    delayed: u64,
    resumed: u64,
}

impl Lazy {
    pub(super) fn new(max_bytes: u64) -> Lazy {
        Lazy {
            portals: FastMap::default(),
            waiting: 0,
            bytes: 0,
            max_bytes,
            next_id: 1,
            delayed: 0,
            resumed: 0,
        }
    }

    /// Whether `portal` is lazy.
    pub(super) fn is_lazy(&self, portal: u32) -> bool {
        // The common case, no lazy portal at all, is one branch on the hot path.
        !self.portals.is_empty() && self.portals.get(&portal).is_some_and(|p| p.lazy)
    }

    /// Whether no PUT waits on any portal (an attach then has nothing to resume).
    pub(super) fn none_waiting(&self) -> bool {
        self.waiting == 0
    }

    /// Whether PUTs wait on `portal` (with their data in or not).
    fn has_waiting(&self, portal: u32) -> bool {
        self.portals.get(&portal).is_some_and(|p| !p.waiting.is_empty())
    }

    pub(super) fn stats(&self) -> LazyStats {
        LazyStats {
            portals: self.portals.values().filter(|p| p.lazy).count(),
            waiting: self.waiting,
            waiting_bytes: self.bytes,
            delayed: self.delayed,
            resumed: self.resumed,
        }
    }

    /// Takes the waiting PUT `at` of `portal` out, and forgets a cleared portal left empty.
    fn take(&mut self, portal: u32, at: usize) -> Option<Delayed> {
        let p = self.portals.get_mut(&portal)?;
        let d = p.waiting.remove(at)?;
        if !p.lazy && p.waiting.is_empty() {
            self.portals.remove(&portal);
        }
        self.bytes -= d.len();
        self.waiting -= 1;
        Some(d)
    }

    /// Takes every waiting PUT of `portal` whose data is in, oldest first (those still
    /// arriving stay), and forgets a cleared portal left empty.
    fn take_ready(&mut self, portal: u32) -> Vec<Delayed> {
        let Some(p) = self.portals.get_mut(&portal) else { return Vec::new() };
        let (ready, arriving): (Vec<Delayed>, Vec<Delayed>) = p.waiting.drain(..).partition(|d| d.ready);
        p.waiting = arriving.into();
        if !p.lazy && p.waiting.is_empty() {
            self.portals.remove(&portal);
        }
        self.waiting -= ready.len();
        self.bytes -= ready.iter().map(Delayed::len).sum::<u64>();
        ready
    }
}

/// Copies the first `mlength` bytes of `data` into `frags`.
fn copy_out(data: &Buffer, frags: &[Frag], mlength: usize) -> Result<usize, LndError> {
    let bad = LndError::new(Errno::EINVAL, Health::LocalError);
    let mut at = 0;
    for f in frags {
        if at == mlength {
            break;
        }
        let n = f.len.min(mlength - at);
        f.buf.copy_from(f.offset, data, at, n).map_err(|_| bad)?;
        at += n;
    }
    if at == mlength { Ok(at) } else { Err(bad) }
}

impl State {
    /// `LNetSetLazyPortal`.
    pub(super) fn set_lazy(&mut self, portal: u32) -> Result<(), MatchError> {
        self.check_portal(portal)?;
        self.lazy.portals.entry(portal).or_default().lazy = true;
        Ok(())
    }

    /// `LNetClearLazyPortal`: the portal drops what matches nothing again, and the PUTs
    /// waiting on it are dropped (those still arriving when they are in).
    pub(super) fn clear_lazy(&mut self, portal: u32, work: &mut Work) -> Result<(), MatchError> {
        self.check_portal(portal)?;
        let Some(p) = self.lazy.portals.get_mut(&portal) else { return Ok(()) };
        p.lazy = false;
        for d in self.lazy.take_ready(portal) {
            // The LND is done with it: the drop NAK is LNet's to send (rdma = false).
            self.drop_put(d.ni, d.from, &d.hdr, d.put, false, DropWhy::LazyDiscarded, work);
        }
        Ok(())
    }

    fn check_portal(&self, portal: u32) -> Result<(), MatchError> {
        let nportals = self.table.nportals();
        if (portal as usize) < nportals { Ok(()) } else { Err(MatchError::BadPortal { portal, nportals }) }
    }

    /// A PUT that matched nothing on lazy `p.ptl_index`: its sink is a buffer of LNet's, and
    /// it waits there once its data is in. `Err` (drop it) when the bytes waiting would pass
    /// the limit.
    pub(super) fn delay_put(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: &LnetHdr,
        p: PutMsg,
        rdma: bool,
    ) -> Result<Parsed, DropWhy> {
        let len = u64::from(hdr.payload_length);
        let total = self.lazy.bytes.checked_add(len).filter(|t| *t <= self.lazy.max_bytes);
        let (Some(total), Ok(n)) = (total, usize::try_from(len)) else { return Err(DropWhy::LazyFull) };
        // An RDMA PUT's sink is registered with the LND's device: from the buffer arena, as
        // LNet buffers are. An IMMEDIATE's copy needs no registration.
        let data = Arc::new(if rdma { Buffer::new(n) } else { Buffer::on_heap(n) });
        let id = self.lazy.next_id;
        self.lazy.next_id += 1;
        self.lazy.bytes = total;
        self.lazy.waiting += 1;
        self.lazy.delayed += 1;
        let frags = Frags::from(Frag::whole(data.clone()));
        let d = Delayed { id, ni, from, hdr: *hdr, put: p, data, ready: false };
        self.lazy.portals.entry(p.ptl_index).or_default().waiting.push_back(d);
        let msg = State::new_recv(ni, from, MsgKind::RecvDelayed { portal: p.ptl_index, id });
        Ok(Parsed::Sink { frags, mlength: n, msg })
    }

    /// The data of waiting PUT `id` is in LNet's buffer (`Ok`), or did not arrive (`Err`).
    pub(super) fn delayed_arrived(
        &mut self,
        portal: u32,
        id: u64,
        result: Result<usize, LndError>,
        work: &mut Work,
    ) {
        let at = self.lazy.portals.get(&portal).and_then(|p| p.waiting.iter().position(|d| d.id == id));
        let Some(at) = at else { return };
        let lazy = self.lazy.is_lazy(portal);
        match result {
            Ok(_) if lazy && self.phase == Phase::Running => {
                if let Some(d) = self.lazy.portals.get_mut(&portal).and_then(|p| p.waiting.get_mut(at)) {
                    d.ready = true;
                }
                // An MD may have been attached while the data moved.
                self.resume_delayed(portal, work);
            }
            Ok(_) => {
                // Cleared, or shutting down, while its data moved: dropped (the drop NAK only
                // while LNet runs; at shutdown there is nobody to send it).
                if let Some(d) = self.lazy.take(portal, at) {
                    if self.phase == Phase::Running {
                        self.drop_put(d.ni, d.from, &d.hdr, d.put, false, DropWhy::LazyDiscarded, work);
                    } else {
                        self.dropped(d.ni, d.from, d.len(), DropWhy::LazyDiscarded);
                    }
                }
            }
            Err(_) => {
                if let Some(d) = self.lazy.take(portal, at) {
                    if let Some(n) = self.nis.get_mut(d.ni) {
                        n.counters.recv_errors += 1;
                        n.peer_mut(d.from).counters.recv_errors += 1;
                    }
                }
            }
        }
    }

    /// Matches the PUTs waiting on `portal` again, oldest first: after an MD was attached
    /// there, or a waiting PUT's data came in.
    pub(super) fn resume_delayed(&mut self, portal: u32, work: &mut Work) {
        if !self.lazy.has_waiting(portal) {
            return;
        }
        let mut at = 0;
        while let Some(d) = self.lazy.portals.get(&portal).and_then(|p| p.waiting.get(at)) {
            if !d.ready {
                at += 1;
                continue;
            }
            let (src, bits, len, offset) = (d.hdr.src, d.put.match_bits, d.len(), u64::from(d.put.offset));
            match self.table.match_put(src, portal, bits, len, offset) {
                MatchResult::Dropped(DropReason::NoMatch) => at += 1,
                MatchResult::Matched(m) => {
                    if let Some(d) = self.lazy.take(portal, at) {
                        self.lazy.resumed += 1;
                        self.deliver_delayed(d, m, work);
                    }
                }
                MatchResult::Dropped(reason) => {
                    if let Some(d) = self.lazy.take(portal, at) {
                        self.drop_put(d.ni, d.from, &d.hdr, d.put, false, DropWhy::Match(reason), work);
                    }
                }
            }
        }
    }

    /// A waiting PUT that matched `m`: its data into the MD, then the PUT event and the ACK as
    /// for a PUT that matched on arrival (as not `rdma`: its LND is done with it, so a failure
    /// here is LNet's to tell the initiator, with the drop NAK if it asked for an ACK).
    fn deliver_delayed(&mut self, d: Delayed, m: Matched, work: &mut Work) {
        if let Parsed::Sink { frags, mlength, msg } = self.accept_put(d.ni, d.from, &d.hdr, d.put, false, m) {
            let result = copy_out(&d.data, &frags, mlength);
            self.finish_recv(msg, result, work);
        }
    }

    /// After an MD was attached to match entry `me`: its portal's waiting PUTs get their turn.
    pub(super) fn resume_after_attach(&mut self, me: crate::matching::MeHandle, work: &mut Work) {
        if let Some((portal, _, _)) = self.table.me_status(me) {
            self.resume_delayed(portal, work);
        }
    }

    /// Shutdown: every PUT waiting with its data in is dropped (those still arriving end with
    /// their LND's error).
    pub(super) fn discard_delayed(&mut self) {
        let portals: Vec<u32> = self.lazy.portals.keys().copied().collect();
        for portal in portals {
            for d in self.lazy.take_ready(portal) {
                self.dropped(d.ni, d.from, d.len(), DropWhy::LazyDiscarded);
            }
        }
    }
}
