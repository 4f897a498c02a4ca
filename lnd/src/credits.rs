//! o2iblnd's credit flow control for one connection (protocol V2), as a pure state machine.
//!
//! A connection with queue depth Q has 2Q+2 receive buffers: Q for messages the peer sends on
//! credit, Q for replies to this side's requests, and 2 for out-of-band NOOPs. [`Credits`]
//! decides which queued transmit may be posted next and what each one costs:
//!
//! | queue | message types | cost |
//! |---|---|---|
//! | reserved (`tx_queue_rsrvd`) | PUT_REQ, GET_REQ | promoted to the credit queue while reserved credits remain (reserved − 1) |
//! | credit (`tx_queue`) | IMMEDIATE and promoted requests | one send credit |
//! | no-credit (`tx_queue_nocred`) | PUT_ACK, PUT_NAK, PUT_DONE, GET_DONE, NOOP | nothing |
//!
//! Every message carries the receive buffers reposted since the last one (`outstanding`) back to
//! the peer; a NOOP goes out when that count reaches the high-water mark and nothing queued can
//! carry it (or when a keepalive is due), with at most two NOOPs in flight. At most
//! `concurrent_sends` messages are posted at once. A peer that returns more credits than Q is a
//! protocol error.
//!
//! Why this cannot deadlock (o2iblnd §3): returning credits never costs a credit (NOOPs use the
//! two out-of-band buffers); replies never wait for credits and are bounded by the requester's
//! reserved credits, which size its second set of Q buffers; a PUT_DONE reuses the credit of its
//! PUT_REQ; no-credit traffic is posted first.
//!
//! The caller drives it: [`Credits::enqueue`] transmits, ask [`Credits::next`] what to post
//! (repeatedly, until it says to stop; a [`Next::Post`] has already been counted, and
//! [`Credits::unpost`] takes it back if posting fails), then report completions
//! ([`Credits::send_completed`]), credits arriving on received messages
//! ([`Credits::credits_returned`]) and receive buffers reposted ([`Credits::rx_reposted`]).

use std::collections::VecDeque;

/// Which queue a transmit joins, by what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxClass {
    /// A request that will be answered (PUT_REQ, GET_REQ): needs a reserved credit, then a credit.
    Request,
    /// An IMMEDIATE message: needs a credit.
    Credited,
    /// A reply, completion or NOOP: needs no credit.
    NoCredit,
}

/// How a receive buffer goes back on the queue (`IBLND_POSTRX_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RxRepost {
    /// The message consumed one of the peer's credits: return it (`PEER_CREDIT`).
    PeerCredit,
    /// Return nothing (`NO_CREDIT`): a NOOP, or a PUT_REQ whose credit the PUT_DONE will reuse.
    NoCredit,
    /// A reply to one of this side's requests: this side may issue another (`RSRVD_CREDIT`).
    ReservedCredit,
}

/// The peer returned more credits than the queue depth allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("peer returned {returned} credits with {have} already held; queue depth is {queue_depth}")]
pub struct CreditOverflow {
    /// Credits returned by the message.
    pub returned: u32,
    /// Credits held before.
    pub have: u32,
    /// The negotiated queue depth.
    pub queue_depth: u32,
}

/// What to post next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next<T> {
    /// Post this transmit now; pack `credits` into its header. `credited` says whether it took a
    /// send credit.
    Post {
        /// The transmit.
        tx: T,
        /// Credits to return to the peer in its header.
        credits: u32,
        /// Whether it consumed a send credit.
        credited: bool,
    },
    /// A NOOP is needed to return credits (or keep the connection alive): create one and
    /// enqueue it as [`TxClass::NoCredit`] with [`Credits::enqueue_noop`], then ask again.
    NeedNoop,
    /// This queued NOOP became redundant: complete it without sending, then ask again.
    DropNoop(T),
    /// Nothing can be posted now.
    Stop,
}

/// Counters and queues of one connection.
#[derive(Clone, Debug)]
pub struct Credits<T> {
    queue_depth: u32,
    concurrent_sends: u32,
    hiw: u32,
    credits: u32,
    outstanding: u32,
    reserved: u32,
    nsends_posted: u32,
    noops_posted: u32,
    /// The lowest `credits` has been since creation.
    min_credits: u32,
    /// Times credited sends ran out of credits: counted when a send finds none, once until
    /// the peer returns some (however often the queue is looked at meanwhile).
    stalls: u64,
    /// A credited send is waiting for a credit (counted in `stalls` already).
    stalled: bool,
    rsrvd: VecDeque<T>,
    queue: VecDeque<T>,
    nocred: VecDeque<T>,
    /// Which queued no-credit entries are NOOPs (parallel to `nocred`).
    nocred_noop: VecDeque<bool>,
    noop_queued: u32,
}

/// A snapshot of the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CreditCounters {
    /// Queue depth Q.
    pub queue_depth: u32,
    /// Send credits held.
    pub credits: u32,
    /// Credits owed to the peer.
    pub outstanding: u32,
    /// Reserved credits for requests.
    pub reserved: u32,
    /// Sends posted and not completed.
    pub nsends_posted: u32,
    /// NOOPs posted and not completed.
    pub noops_posted: u32,
    /// Lowest credit count seen.
    pub min_credits: u32,
    /// Times credited sends ran out of credits (once per wait for the peer's credits).
    pub stalls: u64,
    /// Transmits queued.
    pub queued: usize,
}

/// NOOPs that may be in flight at once (`IBLND_OOB_MSGS`).
pub const OOB_MSGS: u32 = 2;

impl<T> Credits<T> {
    /// A connection with queue depth `queue_depth` (credits and reserved credits start at Q),
    /// at most `concurrent_sends` posted sends, and a NOOP high-water mark of `hiw`.
    pub fn new(queue_depth: u32, concurrent_sends: u32, hiw: u32) -> Credits<T> {
        let q = queue_depth.max(1);
        Credits {
            queue_depth: q,
            concurrent_sends: concurrent_sends.max(1),
            hiw: hiw.clamp(1, q),
            credits: q,
            outstanding: 0,
            reserved: q,
            nsends_posted: 0,
            noops_posted: 0,
            min_credits: q,
            stalls: 0,
            stalled: false,
            rsrvd: VecDeque::new(),
            queue: VecDeque::new(),
            nocred: VecDeque::new(),
            nocred_noop: VecDeque::new(),
            noop_queued: 0,
        }
    }

    /// The counters.
    pub fn counters(&self) -> CreditCounters {
        CreditCounters {
            queue_depth: self.queue_depth,
            credits: self.credits,
            outstanding: self.outstanding,
            reserved: self.reserved,
            nsends_posted: self.nsends_posted,
            noops_posted: self.noops_posted,
            min_credits: self.min_credits,
            stalls: self.stalls,
            queued: self.queued(),
        }
    }

    /// Transmits waiting in the queues.
    pub fn queued(&self) -> usize {
        self.rsrvd.len() + self.queue.len() + self.nocred.len()
    }

    /// Queues a transmit.
    pub fn enqueue(&mut self, tx: T, class: TxClass) {
        match class {
            TxClass::Request => self.rsrvd.push_back(tx),
            TxClass::Credited => self.queue.push_back(tx),
            TxClass::NoCredit => {
                self.nocred.push_back(tx);
                self.nocred_noop.push_back(false);
            }
        }
    }

    /// Queues a NOOP (after [`Next::NeedNoop`]).
    pub fn enqueue_noop(&mut self, tx: T) {
        self.nocred.push_back(tx);
        self.nocred_noop.push_back(true);
        self.noop_queued += 1;
    }

    /// `kiblnd_need_noop` for protocol V2.
    fn need_noop(&self, keepalive_due: bool) -> bool {
        if self.outstanding < self.hiw && !keepalive_due {
            return false;
        }
        // A queued no-credit message can carry the credits; so can a credited one if a
        // credit is available to send it.
        if self.nocred_noop.iter().any(|noop| !noop) {
            return false;
        }
        self.queue.is_empty() || self.credits == 0
    }

    /// What to do next (`kiblnd_check_sends` + `kiblnd_post_tx`). Call repeatedly until it
    /// returns [`Next::Stop`]; a [`Next::Post`] is counted as posted when it is returned: post
    /// the transmit, or call [`Credits::unpost`] if posting failed.
    pub fn next(&mut self, keepalive_due: bool) -> Next<T> {
        while self.reserved > 0 {
            let Some(tx) = self.rsrvd.pop_front() else { break };
            self.reserved -= 1;
            self.queue.push_back(tx);
        }
        if self.noop_queued + self.noops_posted < OOB_MSGS
            && self.need_noop(keepalive_due)
            && self.noop_queued == 0
        {
            return Next::NeedNoop;
        }
        // No-credit traffic first.
        if let Some(&is_noop) = self.nocred_noop.front() {
            if self.nsends_posted >= self.concurrent_sends {
                return Next::Stop;
            }
            if is_noop && (!self.need_noop(keepalive_due) || self.noops_posted >= OOB_MSGS) {
                self.nocred_noop.pop_front();
                self.noop_queued -= 1;
                return match self.nocred.pop_front() {
                    Some(tx) => Next::DropNoop(tx),
                    None => Next::Stop,
                };
            }
            let Some(tx) = self.nocred.pop_front() else { return Next::Stop };
            self.nocred_noop.pop_front();
            if is_noop {
                self.noop_queued -= 1;
                self.noops_posted += 1;
            }
            self.nsends_posted += 1;
            let credits = std::mem::take(&mut self.outstanding);
            return Next::Post { tx, credits, credited: false };
        }
        if self.queue.is_empty() {
            return Next::Stop;
        }
        if self.nsends_posted >= self.concurrent_sends {
            return Next::Stop;
        }
        if self.credits == 0 {
            if !self.stalled {
                self.stalled = true;
                self.stalls += 1;
            }
            return Next::Stop;
        }
        let Some(tx) = self.queue.pop_front() else { return Next::Stop };
        self.credits -= 1;
        self.min_credits = self.min_credits.min(self.credits);
        self.nsends_posted += 1;
        let credits = std::mem::take(&mut self.outstanding);
        Next::Post { tx, credits, credited: true }
    }

    /// Undoes a [`Next::Post`] whose posting failed (the connection is about to close).
    pub fn unpost(&mut self, credits: u32, credited: bool, noop: bool) {
        self.outstanding += credits;
        if credited {
            self.credits += 1;
        }
        self.nsends_posted = self.nsends_posted.saturating_sub(1);
        if noop {
            self.noops_posted = self.noops_posted.saturating_sub(1);
        }
    }

    /// A posted send completed (successfully or not).
    pub fn send_completed(&mut self, noop: bool) {
        self.nsends_posted = self.nsends_posted.saturating_sub(1);
        if noop {
            self.noops_posted = self.noops_posted.saturating_sub(1);
        }
    }

    /// A received message returned `n` credits.
    pub fn credits_returned(&mut self, n: u32) -> Result<(), CreditOverflow> {
        if n == 0 {
            return Ok(());
        }
        match self.credits.checked_add(n) {
            Some(c) if c <= self.queue_depth => {
                self.credits = c;
                self.stalled = false;
                Ok(())
            }
            _ => Err(CreditOverflow { returned: n, have: self.credits, queue_depth: self.queue_depth }),
        }
    }

    /// A receive buffer was reposted with `rule`.
    pub fn rx_reposted(&mut self, rule: RxRepost) {
        match rule {
            RxRepost::PeerCredit => self.outstanding += 1,
            RxRepost::NoCredit => {}
            RxRepost::ReservedCredit => self.reserved += 1,
        }
    }

    /// Empties every queue (the connection is closing), oldest first per queue.
    pub fn drain(&mut self) -> Vec<T> {
        self.nocred_noop.clear();
        self.noop_queued = 0;
        let mut all: Vec<T> = self.nocred.drain(..).collect();
        all.extend(self.queue.drain(..));
        all.extend(self.rsrvd.drain(..));
        all
    }

    /// Visits every queued transmit (for deadline checks).
    pub fn for_each_queued(&self, mut f: impl FnMut(&T)) {
        self.nocred.iter().chain(self.queue.iter()).chain(self.rsrvd.iter()).for_each(&mut f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Posts until told to stop; like the engine, a keepalive is no longer due once anything
    /// was sent.
    fn post_all(c: &mut Credits<u32>, keepalive: bool, noop_ids: &mut u32) -> Vec<(u32, u32, bool)> {
        let mut out = Vec::new();
        let mut keepalive = keepalive;
        loop {
            match c.next(keepalive) {
                Next::Post { tx, credits, credited } => {
                    out.push((tx, credits, credited));
                    keepalive = false;
                }
                Next::NeedNoop => {
                    *noop_ids += 1;
                    c.enqueue_noop(1000 + *noop_ids);
                }
                Next::DropNoop(_) => {}
                Next::Stop => return out,
            }
        }
    }

    #[test]
    fn credited_sends_stop_at_zero_credits_and_resume_when_returned() {
        let mut c = Credits::new(4, 8, 2);
        let mut n = 0;
        for i in 0..6 {
            c.enqueue(i, TxClass::Credited);
        }
        let posted = post_all(&mut c, false, &mut n);
        assert_eq!(posted.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(posted.iter().all(|p| p.2));
        assert_eq!(c.counters().credits, 0);
        assert_eq!(c.counters().stalls, 1);
        // Looking again before the peer returns credits is the same wait.
        assert!(post_all(&mut c, false, &mut n).is_empty());
        assert_eq!(c.counters().stalls, 1);
        c.credits_returned(1).unwrap();
        assert_eq!(post_all(&mut c, false, &mut n).iter().map(|p| p.0).collect::<Vec<_>>(), [4]);
        assert_eq!(c.counters().stalls, 2, "out of credits again: a second wait");
        c.credits_returned(2).unwrap();
        assert_eq!(post_all(&mut c, false, &mut n).iter().map(|p| p.0).collect::<Vec<_>>(), [5]);
        assert_eq!(c.counters().stalls, 2, "the queue emptied with a credit left: no wait");
        assert_eq!(c.counters().min_credits, 0);
    }

    #[test]
    fn concurrent_sends_caps_posted_messages() {
        let mut c = Credits::new(8, 2, 4);
        let mut n = 0;
        for i in 0..5 {
            c.enqueue(i, TxClass::Credited);
        }
        assert_eq!(post_all(&mut c, false, &mut n).len(), 2);
        c.send_completed(false);
        assert_eq!(post_all(&mut c, false, &mut n).len(), 1);
    }

    #[test]
    fn no_credit_traffic_goes_first_and_carries_outstanding_credits() {
        let mut c = Credits::new(4, 8, 4);
        let mut n = 0;
        c.enqueue(1, TxClass::Credited);
        c.enqueue(2, TxClass::NoCredit);
        c.rx_reposted(RxRepost::PeerCredit);
        c.rx_reposted(RxRepost::PeerCredit);
        let posted = post_all(&mut c, false, &mut n);
        assert_eq!(posted, vec![(2, 2, false), (1, 0, true)]);
    }

    #[test]
    fn requests_wait_for_reserved_credits() {
        let mut c = Credits::new(2, 8, 1);
        let mut n = 0;
        for i in 0..4 {
            c.enqueue(i, TxClass::Request);
        }
        // Two reserved credits: two requests promoted and posted on two credits.
        assert_eq!(post_all(&mut c, false, &mut n).iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1]);
        c.credits_returned(2).unwrap();
        assert!(post_all(&mut c, false, &mut n).is_empty(), "no reserved credit left");
        c.rx_reposted(RxRepost::ReservedCredit); // the reply to request 0 arrived
        assert_eq!(post_all(&mut c, false, &mut n).iter().map(|p| p.0).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn noop_at_the_high_water_mark_when_nothing_can_carry_the_credits() {
        let mut c = Credits::new(8, 16, 4);
        let mut n = 0;
        for _ in 0..3 {
            c.rx_reposted(RxRepost::PeerCredit);
        }
        assert!(post_all(&mut c, false, &mut n).is_empty(), "below hiw: keep the credits");
        c.rx_reposted(RxRepost::PeerCredit);
        assert_eq!(post_all(&mut c, false, &mut n), vec![(1001, 4, false)], "hiw reached: NOOP carries 4");
        assert_eq!(c.counters().noops_posted, 1);
        // A queued credited message with a credit available carries them instead of a NOOP.
        for _ in 0..4 {
            c.rx_reposted(RxRepost::PeerCredit);
        }
        c.enqueue(7, TxClass::Credited);
        assert_eq!(post_all(&mut c, false, &mut n), vec![(7, 4, true)]);
    }

    #[test]
    fn at_most_two_noops_in_flight_and_keepalive_forces_one() {
        let mut c = Credits::new(8, 16, 1);
        let mut n = 0;
        for round in 0..3 {
            c.rx_reposted(RxRepost::PeerCredit);
            let p = post_all(&mut c, false, &mut n);
            assert_eq!(p.len(), usize::from(round < 2), "round {round}");
        }
        assert_eq!(c.counters().noops_posted, 2);
        c.send_completed(true);
        assert_eq!(post_all(&mut c, false, &mut n).len(), 1, "a slot freed: the owed credit goes");
        // Nothing owed, but a keepalive is due.
        c.send_completed(true);
        c.send_completed(true);
        assert_eq!(post_all(&mut c, true, &mut n).len(), 1);
        assert!(post_all(&mut c, false, &mut n).is_empty());
    }

    #[test]
    fn overflowing_credits_is_an_error() {
        let mut c: Credits<u32> = Credits::new(4, 8, 2);
        assert!(c.credits_returned(1).is_err(), "already at Q");
        let mut n = 0;
        c.enqueue(1, TxClass::Credited);
        post_all(&mut c, false, &mut n);
        c.credits_returned(1).unwrap();
        let e = c.credits_returned(255).unwrap_err();
        assert_eq!(e.queue_depth, 4);
    }

    #[test]
    fn drain_returns_everything_queued() {
        let mut c = Credits::new(1, 1, 1);
        c.enqueue(1, TxClass::Request);
        c.enqueue(2, TxClass::Credited);
        c.enqueue(3, TxClass::NoCredit);
        let mut all = c.drain();
        all.sort();
        assert_eq!(all, [1, 2, 3]);
        assert_eq!(c.queued(), 0);
    }
}
