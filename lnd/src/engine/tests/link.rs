//! The port going down and up, and the device failing ([`crate::engine::link`]).

use std::sync::Arc;
use std::time::Duration;

use lnet_shim::buffer::Buffer;
use lnet_shim::event::Errno;
use lnet_shim::lnd::LndSend;

use super::{Sim, seed, settle_and_check, tunables};
use crate::engine::LinkState;
use crate::fabric::soft::FaultConfig;
use crate::fabric::{Device, PortState};

/// A PUT of `len` bytes from `a` to `b`, not sent yet (its sink posted at `b`).
fn put_msg(sim: &Sim, a: usize, b: usize, tag: u64, len: usize) -> LndSend {
    sim.put_msg(a, b, tag, len, &Arc::new(Buffer::new(len)), len)
}

fn errno_of(sim: &mut Sim, a: usize, tag: u64, max_steps: u64) -> Option<Errno> {
    sim.wait_send(a, tag, max_steps).err().map(|e| e.errno)
}

#[test]
fn a_port_down_refuses_sends_and_ends_connecting_at_once_and_a_short_outage_keeps_connections() {
    let s = seed();
    let mut sim = Sim::new(s, 3, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    let established = sim.nodes[0].engine.stats().conns_established;

    // A send to a peer not connected yet, then the link goes: the send waits for a
    // connection that cannot be made, and fails at the next poll (one step), not at
    // connect_timeout.
    sim.put(0, 2, 2, 100);
    sim.nodes[0].engine.device().set_port_state(PortState::Down);
    assert_eq!(errno_of(&mut sim, 0, 2, 1), Some(Errno::ENETDOWN), "seed {s}");
    assert_eq!(sim.nodes[0].engine.link(), LinkState::Down);
    assert_eq!(sim.nodes[0].engine.device().query_port().state, PortState::Down);
    assert_eq!(sim.nodes[0].engine.stats().port_errors, 1);

    // While it is down every send is refused at once, whichever peer it is for.
    let msg = put_msg(&sim, 0, 1, 3, 100);
    let now = sim.now;
    assert_eq!(sim.nodes[0].engine.send(now, msg).map_err(|e| e.errno), Err(Errno::ENETDOWN));
    assert_eq!(sim.nodes[0].engine.stats().sends_refused_link, 1);
    sim.run_for(Duration::from_millis(100));

    // Back up: the connection that was up still is (nothing was in flight on it), and a
    // new peer connects.
    sim.nodes[0].engine.device().set_port_state(PortState::Active);
    sim.run_for(Duration::from_millis(1));
    assert_eq!(sim.nodes[0].engine.link(), LinkState::Active, "seed {s}");
    sim.put(0, 1, 4, 100);
    assert!(sim.wait_send(0, 4, 100_000).is_ok(), "seed {s}");
    assert_eq!(sim.nodes[0].engine.stats().conns_established, established, "seed {s}: reconnected");
    sim.put(0, 2, 5, 100);
    assert!(sim.wait_send(0, 5, 100_000).is_ok(), "seed {s}");
    for tag in [1, 2, 4, 5] {
        assert_eq!(sim.sends[&(0, tag)].0, 1, "seed {s}: send {tag} reported more than once");
    }
    settle_and_check(&mut sim);
}

#[test]
fn a_send_in_flight_through_a_long_outage_fails_once_when_rc_retries_run_out() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    // Accepted while the link is up, posted into a link that is down.
    sim.put(0, 1, 2, 64 << 10);
    sim.nodes[0].engine.device().set_port_state(PortState::Down);
    let t0 = sim.now;
    let r = sim.wait_send(0, 2, 10_000_000);
    let e = r.expect_err("a send into a dead link cannot succeed");
    assert_ne!(e.errno, Errno::ENETDOWN, "seed {s}: it was on an established connection");
    assert!(
        sim.now.saturating_duration_since(t0) < Duration::from_secs(60),
        "seed {s}: took {:?}",
        sim.now.saturating_duration_since(t0)
    );
    assert!(sim.nodes[0].engine.device().fault_stats().link_down > 0, "seed {s}: retransmits were lost");
    assert!(sim.nodes[0].engine.stats().conns_closed >= 1, "seed {s}");
    sim.run_for(Duration::from_millis(10));
    assert_eq!(sim.sends[&(0, 2)].0, 1, "seed {s}: reported more than once");

    // The link returns: the next send reconnects and gets through.
    sim.nodes[0].engine.device().set_port_state(PortState::Active);
    sim.run_for(Duration::from_millis(1));
    sim.put(0, 1, 3, 100);
    assert!(sim.wait_send(0, 3, 10_000_000).is_ok(), "seed {s}");
    settle_and_check(&mut sim);
}

#[test]
fn a_failed_device_closes_every_connection_and_refuses_sends_for_good() {
    let s = seed();
    let mut sim = Sim::new(s, 3, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    // One in flight on the connection, one waiting for a connection to node 2.
    sim.put(0, 1, 2, 64 << 10);
    sim.put(0, 2, 3, 100);
    sim.nodes[0].engine.device().inject_device_fatal();
    // Both end at the next poll (one step).
    let e2 = sim.wait_send(0, 2, 1).expect_err("in flight on a failed device");
    let e3 = sim.wait_send(0, 3, 1).expect_err("waiting on a failed device");
    assert_eq!((e2.errno, e3.errno), (Errno::EIO, Errno::ENODEV), "seed {s}");
    assert_eq!(sim.nodes[0].engine.link(), LinkState::Fatal);
    assert_eq!(sim.nodes[0].engine.connections(), 0, "seed {s}: every connection closed");
    assert_eq!(sim.nodes[0].engine.stats().device_fatal, 1);

    // No port event brings it back.
    sim.nodes[0].engine.device().set_port_state(PortState::Active);
    sim.run_for(Duration::from_millis(1));
    assert_eq!(sim.nodes[0].engine.link(), LinkState::Fatal);
    let msg = put_msg(&sim, 0, 1, 4, 100);
    let now = sim.now;
    assert_eq!(sim.nodes[0].engine.send(now, msg).map_err(|e| e.errno), Err(Errno::ENODEV));
    sim.run_for(Duration::from_millis(10));
    for tag in [1, 2, 3] {
        assert_eq!(sim.sends[&(0, tag)].0, 1, "seed {s}: send {tag} reported more than once");
    }
}
