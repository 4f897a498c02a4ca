//! Network interfaces and LNet-level flow control (`lnet_post_send_locked`,
//! `lnet_return_tx_credits_locked`).
//!
//! A message to a peer first takes one of that peer's credits, then one of the NI's; without a
//! peer credit it waits in the peer's FIFO, without an NI credit (holding its peer credit) in the
//! NI's FIFO. `send_done` returns both: the NI credit goes to the head of the NI queue, the peer
//! credit to the head of the peer's queue, which then tries for an NI credit. FIFO order is kept
//! per queue: a message never overtakes one waiting in the same queue.

use std::collections::VecDeque;
use std::sync::Arc;

use super::stats::{DropCounts, MsgCounters, NiStatus};
use crate::hash::FastMap;
use crate::lnd::Lnd;
use crate::nid::Nid;

/// Which credits a message holds or waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CreditState {
    /// None (self-sends, receives, or finished).
    None,
    /// Waiting in the peer's queue for a peer credit.
    WaitPeer,
    /// Holding a peer credit, waiting in the NI's queue for an NI credit.
    WaitNi,
    /// Holding both: handed to the LND.
    Both,
}

/// One peer as LNet sees it on one NI.
pub(super) struct PeerCredits {
    pub(super) available: u32,
    pub(super) min: i64,
    pub(super) queue: VecDeque<u64>,
    pub(super) counters: MsgCounters,
}

impl PeerCredits {
    fn note_min(&mut self) {
        let effective = i64::from(self.available) - self.queue.len() as i64;
        self.min = self.min.min(effective);
    }
}

/// One network interface.
pub(super) struct Ni {
    pub(super) nid: Nid,
    pub(super) lnd: Option<Arc<dyn Lnd>>,
    pub(super) status: NiStatus,
    pub(super) credits_max: u32,
    pub(super) available: u32,
    pub(super) min: i64,
    pub(super) queue: VecDeque<u64>,
    pub(super) peer_credits_max: u32,
    pub(super) peers: FastMap<Nid, PeerCredits>,
    pub(super) counters: MsgCounters,
    pub(super) drops: DropCounts,
}

impl Ni {
    pub(super) fn new(nid: Nid, credits: u32, peer_credits: u32) -> Ni {
        Ni {
            nid,
            lnd: None,
            status: NiStatus::Starting,
            credits_max: credits,
            available: credits,
            min: i64::from(credits),
            queue: VecDeque::new(),
            peer_credits_max: peer_credits,
            peers: FastMap::default(),
            counters: MsgCounters::default(),
            drops: DropCounts::default(),
        }
    }

    /// Starting or up (not failed, not shut down).
    pub(super) fn is_live(&self) -> bool {
        matches!(self.status, NiStatus::Starting | NiStatus::Up)
    }

    pub(super) fn peer_mut(&mut self, nid: Nid) -> &mut PeerCredits {
        let max = self.peer_credits_max;
        self.peers.entry(nid).or_insert_with(|| PeerCredits {
            available: max,
            min: i64::from(max),
            queue: VecDeque::new(),
            counters: MsgCounters::default(),
        })
    }

    fn note_min(&mut self) {
        let effective = i64::from(self.available) - self.queue.len() as i64;
        self.min = self.min.min(effective);
    }

    /// Message `token` to `peer` asks for credits: [`CreditState::Both`] if it may go now,
    /// otherwise the queue it waits in.
    pub(super) fn take(&mut self, peer: Nid, token: u64) -> CreditState {
        let p = self.peer_mut(peer);
        if p.available == 0 || !p.queue.is_empty() {
            p.queue.push_back(token);
            p.note_min();
            return CreditState::WaitPeer;
        }
        p.available -= 1;
        p.note_min();
        self.take_ni(token)
    }

    fn take_ni(&mut self, token: u64) -> CreditState {
        if self.available == 0 || !self.queue.is_empty() {
            self.queue.push_back(token);
            self.note_min();
            return CreditState::WaitNi;
        }
        self.available -= 1;
        self.note_min();
        CreditState::Both
    }

    /// A message to `peer` holding both credits finished: returns them and says which waiting
    /// messages moved on, and to which state (`Both`: may go now).
    pub(super) fn give_back(&mut self, peer: Nid) -> Vec<(u64, CreditState)> {
        let mut moved = Vec::new();
        self.available += 1;
        if let Some(t) = self.queue.pop_front() {
            self.available -= 1;
            moved.push((t, CreditState::Both));
        }
        let p = self.peer_mut(peer);
        p.available += 1;
        if let Some(t) = p.queue.pop_front() {
            p.available -= 1;
            let st = self.take_ni(t);
            moved.push((t, st));
        }
        moved
    }

    /// Empties every queue (shutdown) and returns the tokens that were waiting. Messages from
    /// the NI queue still hold a peer credit: the caller returns it with
    /// [`Ni::return_peer_credit`].
    pub(super) fn drain_queues(&mut self) -> Vec<u64> {
        let mut tokens: Vec<u64> = self.queue.drain(..).collect();
        for p in self.peers.values_mut() {
            tokens.extend(p.queue.drain(..));
        }
        tokens
    }

    /// Returns the peer credit of a message that waited in the NI queue (shutdown).
    pub(super) fn return_peer_credit(&mut self, peer: Nid) {
        let p = self.peer_mut(peer);
        p.available += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    #[test]
    fn peer_then_ni_credits_fifo() {
        let a = nid("10.0.0.1@o2ib");
        let b = nid("10.0.0.2@o2ib");
        let mut ni = Ni::new(nid("10.0.0.9@o2ib"), 3, 2);
        assert_eq!(ni.take(a, 1), CreditState::Both);
        assert_eq!(ni.take(a, 2), CreditState::Both);
        assert_eq!(ni.take(a, 3), CreditState::WaitPeer);
        assert_eq!(ni.take(b, 4), CreditState::Both);
        assert_eq!(ni.take(b, 5), CreditState::WaitNi);
        assert_eq!((ni.available, ni.min), (0, -1));
        assert_eq!(ni.peers[&a].min, -1);
        // 1 finishes: its NI credit goes to 5 (NI queue), its peer credit to 3, which then
        // waits for an NI credit.
        assert_eq!(ni.give_back(a), vec![(5, CreditState::Both), (3, CreditState::WaitNi)]);
        assert_eq!(ni.give_back(b), vec![(3, CreditState::Both)]);
        assert_eq!(ni.give_back(a), vec![]);
        assert_eq!(ni.give_back(b), vec![]);
        assert_eq!(ni.give_back(a), vec![]);
        assert_eq!(ni.available, 3);
        assert_eq!(ni.peers[&a].available, 2);
        assert_eq!(ni.peers[&b].available, 2);
    }
}
