//! Reconnecting after a reject: pacing (o2iblnd's `kib_reconn_list` / `kib_reconn_wait`), giving
//! up once nothing waits, and what a send to a peer with no listener sees.
//!
//! The hostile peer here is a bare CM on a device of its own (no engine): it listens on the
//! o2iblnd service and rejects every REQ it gets with one reason, as a buggy or hostile o2iblnd
//! could, for ever.

use std::time::Duration;

use lnet_shim::event::Errno;
use lnet_shim::lnd::{Health, PeerState};

use super::*;
use crate::cm::ip_cm::{PortSpace, ip_service_id};
use crate::cm::mad::RejReason;
use crate::cm::manager::CmEvent;
use crate::cm::{Cm, CmConfig};
use crate::engine::peer::{QUICK_RECONNECTS, RECONNECT_INTERVAL};
use crate::fabric::soft::{FaultConfig, SoftConfig};
use crate::wire::{ConnParams, IBLND_MSG_SIZE, IBLND_MSG_VERSION, KibRej, RejectReason};

/// A CM at node `at`'s address that rejects every connection request with `reason` (and, for
/// a consumer-defined reject, a `kib_rej` saying `why`), and records when each REQ came.
struct Rejecter {
    dev: SoftDevice,
    cm: Cm,
    reason: RejReason,
    why: Option<RejectReason>,
    reqs: Vec<Instant>,
}

impl Rejecter {
    fn new(sim: &Sim, at: usize, reason: RejReason, why: Option<RejectReason>) -> Rejecter {
        let dev = SoftDevice::open_sim(
            &sim.net,
            ip(at),
            SoftConfig { seed: sim.seed ^ 91, ..SoftConfig::default() },
        );
        let port = dev.query_port();
        let cfg = CmConfig::roce(port.addr, ip(at), dev.query_device().node_guid);
        let mut cm = Cm::new(cfg, sim.seed ^ 92);
        cm.listen(ip_service_id(PortSpace::Tcp, tunables().service));
        Rejecter { dev, cm, reason, why, reqs: Vec::new() }
    }

    fn pump(&mut self, now: Instant) {
        let _ = self.dev.progress(now);
        while let Some((from, mad)) = self.dev.recv_mad() {
            self.cm.handle_mad(now, from, &mad);
        }
        self.cm.handle_timeout(now);
        while let Some(ev) = self.cm.poll_event() {
            if let CmEvent::ConnectRequest { id, .. } = ev {
                self.reqs.push(now);
                let cp = ConnParams { queue_depth: 8, max_frags: 257, max_msg_size: IBLND_MSG_SIZE as u32 };
                let private = match self.why {
                    Some(why) => KibRej::new(IBLND_MSG_VERSION, why, 0x5151, cp).encode().to_vec(),
                    None => Vec::new(),
                };
                let _ = self.cm.reject(now, id, self.reason, &private);
            }
        }
        while let Some((to, mad)) = self.cm.poll_transmit() {
            let _ = self.dev.send_mad(&to, &mad);
        }
        let _ = self.dev.progress(now);
    }

    fn next_deadline(&self) -> Option<Instant> {
        Instant::min_deadline(self.dev.next_deadline(), self.cm.poll_timeout())
    }
}

/// Runs the engines and the rejecter together, time jumping to the earliest deadline of any of
/// them, until `end` or `max_steps` steps. Returns whether `end` was reached.
fn run_with(sim: &mut Sim, rej: &mut Rejecter, end: Instant, max_steps: u64) -> bool {
    run_with_until(sim, rej, end, max_steps, |_| false)
}

/// [`run_with`], stopping early (and returning true) once `done` holds after a step.
fn run_with_until(
    sim: &mut Sim,
    rej: &mut Rejecter,
    end: Instant,
    max_steps: u64,
    done: impl Fn(&Sim) -> bool,
) -> bool {
    for _ in 0..max_steps {
        let now = sim.now;
        for n in &mut sim.nodes {
            n.engine.poll(now);
            if let Err(e) = n.engine.check_attempt_counts() {
                panic!("seed {}: {e}", sim.seed);
            }
        }
        rej.pump(now);
        sim.gather();
        if done(sim) {
            return true;
        }
        let next = sim.nodes.iter().filter_map(|n| n.engine.next_deadline()).chain(rej.next_deadline()).min();
        match next {
            Some(t) if t < end => sim.now = sim.now.max(t),
            _ => {
                sim.now = end;
                return true;
            }
        }
    }
    false
}

/// REQs in `[from, to)`.
fn reqs_between(rej: &Rejecter, from: Instant, to: Instant) -> usize {
    rej.reqs.iter().filter(|&&t| t >= from && t < to).count()
}

/// A peer that rejects every connection request with a reason o2iblnd retries (CM STALE_CONN,
/// CONN_RACE, CONN_STALE). o2iblnd retries at once ten times (`kib_reconn_list`), then once a
/// second (`KIB_RECONN_HIGH_RACE`, `kib_reconn_wait`), and only while transmits wait: those
/// expire at their deadline (`timeout`, 50 s), and then it stops. Before, the engine retried
/// on every REJ at once: the REQ→REJ loop ran as fast as the network went (about 83 000
/// REQs a simulated second, a round trip every 12 µs) until the send expired.
#[test]
fn a_peer_that_rejects_every_request_is_asked_ten_times_then_once_a_second_until_the_send_expires() {
    let cases = [
        ("CM STALE_CONN", RejReason::StaleConn, None),
        ("CONN_RACE", RejReason::ConsumerDefined, Some(RejectReason::ConnRace)),
        ("CONN_STALE", RejReason::ConsumerDefined, Some(RejectReason::ConnStale)),
    ];
    for (k, (what, reason, why)) in cases.into_iter().enumerate() {
        let s = seed().wrapping_add(k as u64);
        let mut sim = Sim::new(s, 1, &tunables(), FaultConfig::NONE);
        let mut rej = Rejecter::new(&sim, 1, reason, why);
        let t0 = sim.now;
        let (a, b) = (nid(0), nid(1));
        let msg = put_send(a, b, 1, 100);
        sim.nodes[0].engine.send(sim.now, msg).unwrap();
        // One simulated second, with a step budget the unpaced loop runs out of first.
        let one_s = t0 + Duration::from_secs(1);
        let reached = run_with(&mut sim, &mut rej, one_s, 200_000);
        let first = reqs_between(&rej, t0, one_s);
        let took = sim.now.saturating_duration_since(t0);
        println!("{what}: {first} REQs in the first {took:?} (the step budget ran out first: {})", !reached);
        assert!(
            reached,
            "seed {s}: {what}: the REQ/REJ loop used up the step budget ({first} REQs in {took:?})"
        );
        // The first attempt and ten quick reconnects.
        assert_eq!(first, 1 + QUICK_RECONNECTS as usize, "seed {s}: {what}");
        let state = sim.nodes[0].engine.peers()[0].state;
        assert_eq!(state, PeerState::Connecting, "seed {s}: {what}: a reconnect is due");
        // Then about one a second until the send's deadline.
        let timeout = tunables().tx_timeout();
        let expired = t0 + timeout + Duration::from_secs(1);
        assert!(run_with(&mut sim, &mut rej, expired, 1_000_000), "seed {s}: {what}");
        let paced = reqs_between(&rej, one_s, t0 + timeout);
        let seconds = (timeout.as_secs() - 1) as usize;
        println!("{what}: {paced} REQs in the next {seconds} s");
        assert!(paced.abs_diff(seconds) <= 2, "seed {s}: {what}: {paced} REQs in {seconds} s");
        // A second apart, on time: the engine asks to be polled when the reconnect is due
        // (`next_deadline`), not only at its next connection scan.
        let gaps: Vec<Duration> = rej
            .reqs
            .windows(2)
            .skip(QUICK_RECONNECTS as usize)
            .map(|w| w[1].saturating_duration_since(w[0]))
            .collect();
        let on_time =
            |g: &Duration| *g >= RECONNECT_INTERVAL && *g < RECONNECT_INTERVAL + Duration::from_millis(1);
        assert!(gaps.iter().all(on_time), "seed {s}: {what}: {gaps:?}");
        // The send ended once, with the timeout.
        let (count, r) = sim.sends[&(0, 1)];
        let e = r.unwrap_err();
        assert_eq!(
            (count, e.errno, e.health),
            (1, Errno::ETIMEDOUT, Health::NetworkTimeout),
            "seed {s}: {what}"
        );
        // Nothing waits any more: no more REQs.
        let total = rej.reqs.len();
        let later = sim.now + Duration::from_secs(20);
        assert!(run_with(&mut sim, &mut rej, later, 1_000_000), "seed {s}: {what}");
        assert_eq!(rej.reqs.len(), total, "seed {s}: {what}: REQs after the send ended");
        assert_eq!(sim.sends[&(0, 1)].0, 1, "seed {s}: {what}");
        assert_eq!(sim.nodes[0].engine.tx_descriptors().0, 0, "seed {s}: {what}: descriptors leaked");
        assert_eq!(sim.nodes[0].engine.connections(), 0, "seed {s}: {what}");
        // A new send starts afresh: ten quick attempts again.
        let t1 = sim.now;
        let msg = put_send(a, b, 2, 100);
        sim.nodes[0].engine.send(sim.now, msg).unwrap();
        assert!(run_with(&mut sim, &mut rej, t1 + Duration::from_millis(500), 200_000), "seed {s}: {what}");
        assert_eq!(reqs_between(&rej, t1, sim.now), 1 + QUICK_RECONNECTS as usize, "seed {s}: {what}");
    }
}

/// Sends queued while a paced reconnect waits go with it: they neither fail at once nor start
/// an attempt of their own; each ends exactly once.
#[test]
fn sends_queued_while_a_reconnect_waits_go_with_it_and_end_once() {
    let s = seed();
    let mut sim = Sim::new(s, 1, &tunables(), FaultConfig::NONE);
    let mut rej = Rejecter::new(&sim, 1, RejReason::ConsumerDefined, Some(RejectReason::ConnRace));
    let (a, b) = (nid(0), nid(1));
    let send = |sim: &mut Sim, tag: u64| {
        let msg = put_send(a, b, tag, 100);
        sim.nodes[0].engine.send(sim.now, msg).unwrap();
    };
    let t0 = sim.now;
    send(&mut sim, 1);
    assert!(run_with(&mut sim, &mut rej, t0 + Duration::from_millis(300), 200_000), "seed {s}");
    let before = rej.reqs.len();
    for tag in 2..=5 {
        send(&mut sim, tag);
    }
    let soon = sim.now + Duration::from_millis(100);
    assert!(run_with(&mut sim, &mut rej, soon, 200_000), "seed {s}");
    assert_eq!(rej.reqs.len(), before, "seed {s}: the new sends waited for the paced reconnect");
    assert!((1..=5).all(|t| !sim.sends.contains_key(&(0, t))), "seed {s}: nothing failed yet");
    let end = t0 + tunables().tx_timeout() + Duration::from_secs(2);
    assert!(run_with(&mut sim, &mut rej, end, 1_000_000), "seed {s}");
    for tag in 1..=5 {
        let (count, r) = sim.sends[&(0, tag)];
        assert_eq!(count, 1, "seed {s}: send {tag} ended once");
        assert_eq!(r.unwrap_err().errno, Errno::ETIMEDOUT, "seed {s}: send {tag}");
    }
}

/// A legitimate connection race (both sides connect at once; the lower NID hash's REQ is
/// rejected with CONN_RACE and it takes the other's) settles in a few round trips, as before:
/// the reconnect pacing does not slow it down.
#[test]
fn a_connection_race_still_settles_within_microseconds() {
    for k in 0..10 {
        let s = seed().wrapping_add(k);
        let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
        let t0 = sim.now;
        sim.put(0, 1, 1, 2000);
        sim.put(1, 0, 2, 2000);
        let done = sim.run_until(100_000, |sim| {
            sim.gather();
            sim.sends.contains_key(&(0, 1)) && sim.sends.contains_key(&(1, 2))
        });
        assert!(done, "seed {s}");
        assert!(sim.sends[&(0, 1)].1.is_ok() && sim.sends[&(1, 2)].1.is_ok(), "seed {s}: {:?}", sim.sends);
        let took = sim.now.saturating_duration_since(t0);
        let rejected: u64 = sim.nodes.iter().map(|n| n.engine.stats().accepts_rejected).sum();
        assert!(rejected >= 1, "seed {s}: there was a race");
        assert!(took < Duration::from_micros(200), "seed {s}: the race took {took:?}");
    }
}

/// A send to a peer with no listener fails in one round trip, and so does the next one: the
/// LND holds nothing back (o2iblnd: `kiblnd_peer_connect_failed` hands LNet the error and the
/// next send connects again; LNet health decides about retries). When the peer's listener
/// comes up, the next send connects at once. Before, the reject barred new attempts for the
/// connect timeout (12 s): a send in that window waited the whole 12 s for its REQ and got
/// EHOSTUNREACH, and one sent after the listener came up waited as long to be delivered.
#[test]
fn no_listener_fails_each_send_in_one_round_trip_and_a_listener_that_comes_up_is_reached_at_once() {
    let s = seed();
    let mut other = tunables();
    other.service = 988;
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.add_node(1, other.clone(), FaultConfig::NONE, SoftConfig::default(), 1001);
    let start = sim.now;
    for (tag, at) in [(1u64, 0u64), (2, 1), (3, 5), (4, 11)] {
        let when = start + Duration::from_secs(at);
        if sim.now < when {
            sim.run_for(when.saturating_duration_since(sim.now));
        }
        let t0 = sim.now;
        sim.put(0, 1, tag, 100);
        let r = sim.wait_send(0, tag, 100_000).unwrap_err();
        let took = sim.now.saturating_duration_since(t0);
        println!("send {tag} at +{at} s: {:?} after {took:?}", r.errno);
        assert_eq!(
            (r.errno, r.health),
            (Errno::EHOSTUNREACH, Health::NetworkTimeout),
            "seed {s}: send {tag}"
        );
        assert!(took < Duration::from_millis(10), "seed {s}: send {tag} took {took:?}");
    }
    // The peer's LNet starts (its listener on the right service).
    sim.add_node(1, tunables(), FaultConfig::NONE, SoftConfig::default(), 1002);
    let t0 = sim.now;
    let sink = sim.put(0, 1, 5, 100);
    assert!(sim.wait_send(0, 5, 100_000).is_ok(), "seed {s}");
    let took = sim.now.saturating_duration_since(t0);
    assert!(took < Duration::from_millis(10), "seed {s}: the listener was reached after {took:?}");
    assert_eq!(sink.to_vec(0, 3).unwrap(), vec![pattern_byte(5, 0), pattern_byte(5, 1), pattern_byte(5, 2)]);
}

/// A peer that refuses for good (o2iblnd FATAL, as for a NID outside its `accept_nids`) fails
/// every send in one round trip with `ECONNREFUSED`, however many there are: a failed attempt
/// is no reconnect, so it is not paced. Before, the eleventh attempt since the last connection
/// was put off by a second, and as nothing woke the engine for it, the send waited for its own
/// deadline (50 s) and failed with `ETIMEDOUT`.
#[test]
fn every_send_to_a_peer_that_refuses_fails_in_one_round_trip_however_many() {
    let s = seed();
    let mut sim = Sim::new(s, 1, &tunables(), FaultConfig::NONE);
    let mut rej = Rejecter::new(&sim, 1, RejReason::ConsumerDefined, Some(RejectReason::Fatal));
    let (a, b) = (nid(0), nid(1));
    for tag in 1..=3 * u64::from(QUICK_RECONNECTS) {
        let t0 = sim.now;
        let msg = put_send(a, b, tag, 100);
        sim.nodes[0].engine.send(sim.now, msg).unwrap();
        let end = t0 + Duration::from_secs(60);
        let ended = run_with_until(&mut sim, &mut rej, end, 100_000, |sim| sim.sends.contains_key(&(0, tag)));
        assert!(ended, "seed {s}: send {tag}: the step budget ran out");
        let took = sim.now.saturating_duration_since(t0);
        let r = sim.sends.get(&(0, tag)).map(|(n, r)| (*n, r.map_err(|e| e.errno)));
        assert_eq!(r, Some((1, Err(Errno::ECONNREFUSED))), "seed {s}: send {tag} after {took:?}");
        assert!(took < Duration::from_millis(1), "seed {s}: send {tag} took {took:?}");
    }
    assert_eq!(rej.reqs.len(), 3 * QUICK_RECONNECTS as usize, "seed {s}: one REQ a send");
}
