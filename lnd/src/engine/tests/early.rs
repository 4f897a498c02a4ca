//! Replies sent from a receive upcall leave at once ([`Engine::set_early_sends`]).
//!
//! Node 1's LNet is an echo: every IMMEDIATE PUT it receives is answered from inside the upcall
//! with a PUT back to its sender (match bits with [`REPLY`] set), queued where the engine's hook
//! finds it, as the driver's thread-local queue holds an event callback's reply.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lnet_shim::buffer::Buffer;
use lnet_shim::hdr::{LnetHdr, LnetMsg};
use lnet_shim::lnd::{Frag, LndError, LndSend, LndUpcalls, RecvDisposition, SendStatus};
use lnet_shim::nid::Nid;

use super::*;

/// Set in the match bits of an echo's reply.
const REPLY: u64 = 1 << 40;
/// Bytes of each request and reply.
const LEN: usize = 8;

thread_local! {
    /// The echo's replies, waiting for the engine's hook (the driver's `LOCAL` in miniature).
    static QUEUED: RefCell<VecDeque<LndSend>> = const { RefCell::new(VecDeque::new()) };
}

fn take_queued(out: &mut Vec<LndSend>) {
    QUEUED.with(|q| out.extend(q.borrow_mut().drain(..)));
}

/// An LNet that answers every PUT it receives, from the upcall.
struct Echo {
    me: Nid,
    /// Pings answered.
    received: AtomicU64,
    /// Send results by token (the request's match bits).
    sent: Mutex<Vec<(u64, Result<SendStatus, LndError>)>>,
}

impl LndUpcalls for Echo {
    fn recv(&self, _from: Nid, _hdr: &LnetHdr, _rdma: bool) -> RecvDisposition {
        RecvDisposition::Drop
    }

    fn recv_done(&self, _token: u64, _result: Result<usize, LndError>) {}

    fn recv_immediate(&self, from: Nid, hdr: &LnetHdr, payload: &[u8]) {
        let LnetMsg::Put(p) = hdr.msg else { return };
        let reply = LndSend {
            target: from,
            hdr: put_hdr(self.me, from, p.match_bits | REPLY, payload.len()),
            payload: Frag::whole(Arc::new(Buffer::from_slice(payload))).into(),
            get_sink: None,
            token: p.match_bits,
        };
        QUEUED.with(|q| q.borrow_mut().push_back(reply));
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    fn send_done(&self, token: u64, result: Result<SendStatus, LndError>) {
        self.sent.lock().unwrap().push((token, result));
    }
}

/// Node 0 as usual (TestLnet), node 1 an echo whose engine takes early sends if `early`.
fn echo_sim(s: u64, faults: FaultConfig, early: bool) -> (Sim, Arc<Echo>) {
    let mut sim = Sim::new(s, 1, &tunables(), faults);
    let dev = SoftDevice::open_sim(
        &sim.net,
        ip(1),
        SoftConfig { faults, seed: s ^ 0xec40, ..SoftConfig::default() },
    );
    let echo = Arc::new(Echo { me: nid(1), received: AtomicU64::new(0), sent: Mutex::new(Vec::new()) });
    let mut engine =
        Engine::new(dev, EngineConfig::new(nid(1), tunables(), 1001, s ^ 0x1001), echo.clone()).unwrap();
    engine.set_poll_all_cqs(true);
    if early {
        engine.set_early_sends(take_queued);
    }
    sim.nodes.push(Node { engine, lnet: Arc::new(TestLnet::default()), nid: nid(1) });
    sim.last_work.push(sim.now);
    (sim, echo)
}

/// A ping from node 0: an IMMEDIATE PUT of [`LEN`] bytes tagged `tag`, its reply's sink posted.
fn ping(sim: &mut Sim, tag: u64) -> Arc<Buffer> {
    let sink = Arc::new(Buffer::new(LEN));
    sim.nodes[0].lnet.post_sink(tag | REPLY, vec![Frag::whole(sink.clone())], LEN);
    let msg = put_send(nid(0), nid(1), tag, LEN);
    sim.nodes[0].engine.send(sim.now, msg).unwrap();
    sink
}

/// Steps the simulation with node 1's poll in its two halves; returns, for the turn in which
/// node 1's echo answered the ping, how many messages node 1 posted in the first half and in
/// the second. Without the hook (`early` false) the reply is handed to the engine between the
/// halves, as the driver's `take_commands` does.
fn turn_of_the_ping(sim: &mut Sim, echo: &Echo, early: bool) -> (u64, u64) {
    for _ in 0..100_000 {
        let now = sim.now;
        sim.nodes[0].engine.poll(now);
        let answered = echo.received.load(Ordering::Relaxed);
        let e = &mut sim.nodes[1].engine;
        let tx0 = e.stats().tx_msgs;
        let turn = e.poll_completions(now);
        let tx1 = e.stats().tx_msgs;
        let mut queued = Vec::new();
        take_queued(&mut queued);
        assert!(!early || queued.is_empty(), "seed {}: the hook left a reply queued", sim.seed);
        for msg in queued {
            e.send(now, msg).unwrap();
        }
        e.poll_finish(now, turn);
        let tx2 = e.stats().tx_msgs;
        if echo.received.load(Ordering::Relaxed) > answered {
            return (tx1 - tx0, tx2 - tx1);
        }
        let next = sim.nodes.iter().filter_map(|n| n.engine.next_deadline()).min();
        match next {
            Some(t) => sim.now = sim.now.max(t),
            None => break,
        }
    }
    panic!("seed {}: the ping never reached node 1", sim.seed);
}

/// With the hook the reply is posted in the first half of the turn that received the ping,
/// before that half's other completions and the second half's bookkeeping; without it, in
/// the second half.
#[test]
fn a_reply_made_in_a_receive_upcall_is_posted_in_the_same_half_turn() {
    let s = seed();
    for early in [true, false] {
        let (mut sim, echo) = echo_sim(s, FaultConfig::NONE, early);
        // Connect first (the hook or the driver's way), so the turn measured is the ping's.
        let _ = ping(&mut sim, 1);
        let first = turn_of_the_ping(&mut sim, &echo, early);
        assert!(sim.run_until(100_000, |sim| sim.nodes[0].lnet.take_recv_done().len() == 1), "seed {s}");
        let sink = ping(&mut sim, 2);
        let want = if early { (1, 0) } else { (0, 1) };
        assert_eq!(
            turn_of_the_ping(&mut sim, &echo, early),
            want,
            "seed {s}: posted in the halves (early {early})"
        );
        assert_eq!(first, want, "seed {s}: the first ping too (early {early})");
        assert!(sim.run_until(100_000, |sim| !sim.nodes[0].lnet.take_recv_done().is_empty()), "seed {s}");
        assert_eq!(sink.to_vec(0, LEN).unwrap(), filled(2, LEN).to_vec(0, LEN).unwrap(), "seed {s}");
    }
}

/// 500 pings, 50 in flight, over a lossy, reordering, duplicating wire: every reply sent
/// from the upcall completes exactly once and arrives with the ping's bytes.
#[test]
fn replies_sent_from_receive_upcalls_complete_exactly_once_under_loss() {
    let s = seed();
    let faults = FaultConfig {
        tx: DirFaults { drop: 0.03, reorder: 0.02, duplicate: 0.01, ..DirFaults::NONE },
        rx: DirFaults::NONE,
    };
    let (mut sim, echo) = echo_sim(s, faults, true);
    let mut sinks = Vec::new();
    let (total, window) = (500u64, 50u64);
    let mut issued = 0;
    let mut replies = 0;
    while issued < window {
        issued += 1;
        sinks.push((issued, ping(&mut sim, issued)));
    }
    let ok = sim.run_until(5_000_000, |sim| {
        while issued < total && issued < replies + window {
            issued += 1;
            sinks.push((issued, ping(sim, issued)));
        }
        for (tag, r) in sim.nodes[0].lnet.take_recv_done() {
            assert_eq!(r, Ok(LEN), "seed {s}: reply {tag}");
            replies += 1;
        }
        replies == total
    });
    assert!(ok, "seed {s}: {replies} of {total} replies");
    // A reply completes when its RC ACK arrives, and a lost last ACK waits for the requester's
    // retransmission timer (seed 608237899 on the wire path: two of them 0.5 s after the last
    // reply landed). Wait for every one (bounded), then long enough for any second completion.
    let all = sim.run_until(5_000_000, |_| echo.sent.lock().unwrap().len() >= total as usize);
    assert!(all, "seed {s}: {} of {total} replies completed", echo.sent.lock().unwrap().len());
    sim.run_for(std::time::Duration::from_secs(2));
    for (tag, sink) in &sinks {
        assert_eq!(
            sink.to_vec(0, LEN).unwrap(),
            filled(*tag, LEN).to_vec(0, LEN).unwrap(),
            "seed {s}: {tag}"
        );
    }
    let mut sent = echo.sent.lock().unwrap().clone();
    sent.sort_by_key(|x| x.0);
    assert_eq!(sent.len(), total as usize, "seed {s}: every reply completes once");
    for (i, (tag, r)) in sent.iter().enumerate() {
        assert_eq!((*tag, r.is_ok()), (i as u64 + 1, true), "seed {s}: {r:?}");
    }
    let pings_done = sim.nodes[0].lnet.take_send_done();
    assert_eq!(pings_done.len(), total as usize, "seed {s}: every ping completes once");
    assert!(pings_done.iter().all(|(_, r)| r.is_ok()), "seed {s}: {pings_done:?}");
    // The wire did lose frames: replies were retransmitted.
    let retransmits: u64 = sim.nodes.iter().map(|n| n.engine.device().stats().retransmits).sum();
    assert!(retransmits > 0, "seed {s}: no frame was lost");
    check_credit_invariant(&sim);
}
