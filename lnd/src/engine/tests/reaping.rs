//! CQ reaping as the driver does it: event mode (fds), and polling mode while spinning.

use std::time::Duration;

use super::{Sim, Workload, assert_write_path, seed, settle_and_check, tunables};
use crate::fabric::Device;
use crate::fabric::soft::{DirFaults, FaultConfig};

fn notifications(sim: &Sim) -> u64 {
    sim.nodes.iter().map(|n| n.engine.device().stats().cq_notifications).sum()
}

/// 2,000 mixed transfers (1% loss, reordering, duplicates) between two engines reaping CQs
/// the driver's way; every byte verified, credits and descriptors home.
fn run(window: Duration) -> (Sim, u64) {
    let s = seed();
    let faults = FaultConfig {
        tx: DirFaults { drop: 0.01, reorder: 0.01, duplicate: 0.005, ..DirFaults::NONE },
        rx: DirFaults::NONE,
    };
    let mut sim = Sim::new(s, 2, &tunables(), faults);
    sim.reap_like_the_driver(window);
    let mut w = Workload::new(s, 2_000, 16, 256 << 10);
    w.run(&mut sim, 5_000_000);
    assert_eq!((w.verified, w.failed), (2_000, 0), "seed {s}, window {window:?}");
    assert_write_path(&sim);
    let n = notifications(&sim);
    settle_and_check(&mut sim);
    (sim, n)
}

#[test]
fn event_mode_reaps_every_completion_through_notifications() {
    let (_, n) = run(Duration::ZERO);
    assert!(n > 2_000, "seed {}: {n} notifications for 2,000 transfers in event mode", seed());
}

/// While busy, CQs are polled unarmed: a small fraction of the notifications, nothing lost.
#[test]
fn polling_mode_reaps_busy_cqs_without_notifications() {
    let (_, events) = run(Duration::ZERO);
    let (_, polled) = run(Duration::from_micros(200));
    eprintln!("notifications: {events} event mode, {polled} polling");
    assert!(polled * 4 < events, "seed {}: {polled} notifications polling, {events} in event mode", seed());
}

/// A driver about to sleep arms every CQ it was polling ([`crate::engine::Engine::arm_cqs`]):
/// the next completion signals the CQ's fd, which is what wakes a sleeping scheduler.
#[test]
fn cqs_are_armed_before_the_driver_sleeps() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    // A window longer than the test: only `arm_cqs` arms a CQ that has been busy.
    sim.reap_like_the_driver(Duration::from_secs(3600));
    for tag in 1..=3u64 {
        sim.put(0, 1, tag, 100);
        assert!(sim.wait_send(0, tag, 100_000).is_ok(), "seed {s}");
        sim.run_for(Duration::from_millis(1));
        let before = notifications(&sim);
        sim.put(0, 1, 100 + tag, 100);
        assert!(sim.wait_send(0, 100 + tag, 100_000).is_ok(), "seed {s}");
        assert_eq!(notifications(&sim), before, "seed {s}: busy CQs are polled, not armed");
        let now = sim.now;
        for n in &mut sim.nodes {
            n.engine.arm_cqs(now);
        }
        sim.put(0, 1, 200 + tag, 100);
        assert!(sim.wait_send(0, 200 + tag, 100_000).is_ok(), "seed {s}");
        assert!(notifications(&sim) > before, "seed {s}: arm_cqs left a CQ unarmed");
    }
}

/// A message that arrives with the ACK of this node's own earlier send (a reply carrying a
/// piggybacked ACK) is delivered in the first half of the poll; that send's completion, only
/// bookkeeping, is reported in the second half, after the turn's transmits.
#[test]
fn a_send_completed_by_a_piggybacked_ack_is_reported_after_the_message_carrying_it() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    sim.run_for(Duration::from_millis(1));
    sim.gather();
    let hop = Duration::from_millis(1);
    sim.put(0, 1, 2, 100);
    let now = sim.now;
    sim.nodes[0].engine.poll(now);
    // Node 1 receives PUT 2 and answers with PUT 3 between the halves of its poll, as an
    // event callback does: the answer carries the ACK.
    let now = now + hop;
    sim.now = now;
    let rode = sim.nodes[1].engine.device().stats().acks_piggybacked;
    let turn = sim.nodes[1].engine.poll_completions(now);
    assert_eq!(sim.nodes[1].lnet.take_recv_done(), [(2, Ok(100))], "seed {s}");
    sim.put(1, 0, 3, 100);
    sim.nodes[1].engine.poll_finish(now, turn);
    assert_eq!(sim.nodes[1].engine.device().stats().acks_piggybacked, rode + 1, "seed {s}: the ACK rode");
    let now = now + hop;
    sim.now = now;
    let turn = sim.nodes[0].engine.poll_completions(now);
    assert_eq!(sim.nodes[0].lnet.take_recv_done(), [(3, Ok(100))], "seed {s}");
    assert!(sim.nodes[0].lnet.take_send_done().is_empty(), "seed {s}: reported before the transmits");
    sim.nodes[0].engine.poll_finish(now, turn);
    let done = sim.nodes[0].lnet.take_send_done();
    assert_eq!(done.len(), 1, "seed {s}: {done:?}");
    assert_eq!(done[0].0, 2, "seed {s}: {done:?}");
    assert!(done[0].1.is_ok(), "seed {s}: {done:?}");
}
