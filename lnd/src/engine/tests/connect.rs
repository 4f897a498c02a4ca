//! Connection scenarios: loss, QP sizing, rejects and retries, races, restarts, dead peers,
//! small queue depths, NOOP credit return.

use std::sync::Arc;
use std::time::Duration;

use lnet_shim::buffer::Buffer;
use lnet_shim::event::Errno;
use lnet_shim::lnd::{Frag, Frags, Health, LndSend, PeerState};

use super::*;
use crate::fabric::soft::{DirFaults, FaultConfig, SoftConfig, SoftLimits};

fn lossy(p: f64) -> FaultConfig {
    FaultConfig { tx: DirFaults { drop: p, reorder: p / 4.0, ..DirFaults::NONE }, rx: DirFaults::NONE }
}

fn assert_pattern(buf: &Buffer, tag: u64, len: usize, seed: u64) {
    let got = buf.to_vec(0, len).unwrap();
    assert!(
        got.iter().enumerate().all(|(i, &x)| x == pattern_byte(tag, i)),
        "seed {seed}: tag {tag} corrupt"
    );
}

#[test]
fn handshake_and_transfer_under_20_percent_loss() {
    for k in 0..20 {
        let s = seed().wrapping_add(k);
        // The most transport retries a QP can have (3 bits). At 20% loss a go-back-N round
        // makes no progress about a third of the time, so o2iblnd's default of 5 gives up
        // (RETRY_EXC_ERR, as a real HCA would) on about one transfer in 400 (measured: 5 of
        // 2000 seeds); 7 retries make that rarer, not impossible (below).
        let mut sim = Sim::new(s, 2, &tunables_with_most_retries(), lossy(0.2));
        let mut tag = 5;
        let mut sink = sim.put(0, 1, tag, 300_000);
        let mut r = sim.wait_send(0, tag, 2_000_000);
        let stats = |sim: &Sim| (sim.nodes[0].engine.device().stats(), sim.nodes[1].engine.device().stats());
        if let Err(e) = r {
            // Even 7 retries run out now and then (measured: one transfer in about 8000): the
            // QP is in error, the LND closes the connection and fails the transmit with
            // -EIO, and the next transmit connects again and goes through.
            let (d0, d1) = stats(&sim);
            assert!(
                e.errno == Errno::EIO && d0.retries_exceeded + d1.retries_exceeded > 0,
                "seed {s}: {e:?} at {:?} dev0 {d0:?} dev1 {d1:?}",
                sim.now
            );
            eprintln!("seed {s}: a QP ran out of retries ({e:?}); sending again");
            tag = 6;
            sink = sim.put(0, 1, tag, 300_000);
            r = sim.wait_send(0, tag, 2_000_000);
        }
        assert!(r.is_ok(), "seed {s}: {r:?} at {:?} {:?}", sim.now, stats(&sim));
        // The sink's receive ends when its PUT_ACK is acknowledged, which under loss can be
        // after the source's PUT_DONE (on the single-copy path the data is there at once).
        let ended = sim.run_until(2_000_000, |sim| {
            sim.gather();
            sim.recvs.contains_key(&(1, tag))
        });
        assert!(ended, "seed {s}: the receive never ended");
        assert_eq!(sim.recvs[&(1, tag)], (1, Ok(300_000)), "seed {s}");
        assert_pattern(&sink, tag, 300_000, s);
        let cm = sim.nodes[0].engine.cm_stats();
        assert_eq!(sim.nodes[0].engine.conn_details(nid(1)).len(), 1, "seed {s}: {cm:?}");
    }
}

#[test]
fn queue_depth_shrinks_until_a_tiny_device_accepts_the_qp() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    // Room for about 4 x (258 send + 2 receive) work-queue entries: Q = 8 does not fit.
    let tiny = SoftConfig {
        limits: SoftLimits { wqe_budget: 1200, ..SoftLimits::default() },
        ..SoftConfig::default()
    };
    sim.add_node(0, tunables(), FaultConfig::NONE, tiny.clone(), 1000);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    let a = sim.nodes[0].engine.conn_details(nid(1));
    let b = sim.nodes[1].engine.conn_details(nid(0));
    assert_eq!(a[0].credits.queue_depth, 4, "seed {s}: active side shrank Q and asked for 4");
    assert_eq!(b[0].credits.queue_depth, 4, "seed {s}: passive side accepted the smaller Q");
    // And the other way: the passive side is the tiny one.
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.add_node(1, tunables(), FaultConfig::NONE, tiny, 1001);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    assert_eq!(sim.nodes[0].engine.conn_details(nid(1))[0].credits.queue_depth, 4, "seed {s}");
    let mut w = Workload::new(s, 300, 16, 200_000);
    w.run(&mut sim, 5_000_000);
    assert_eq!(w.verified, 300);
}

#[test]
fn msg_queue_size_reject_is_retried_with_the_peers_depth() {
    let s = seed();
    let mut big = tunables();
    big.peer_credits = 32;
    big.credits = 1024;
    big.peer_credits_hiw = 0;
    big.concurrent_sends = 0;
    big.finalize().unwrap();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.add_node(0, big, FaultConfig::NONE, SoftConfig::default(), 1000);
    sim.put(0, 1, 1, 5000);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    assert_eq!(sim.nodes[0].engine.stats().connects_rejected, 1, "seed {s}");
    assert_eq!(sim.nodes[1].engine.stats().accepts_rejected, 1);
    assert_eq!(sim.nodes[0].engine.conn_details(nid(1))[0].credits.queue_depth, 8);
}

#[test]
fn rdma_frags_reject_is_retried_and_too_many_fragments_is_emsgsize() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.add_node_with(1, tunables(), FaultConfig::NONE, SoftConfig::default(), 1001, |c| c.max_frags = 16);
    sim.put(0, 1, 1, 64 << 10);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    assert_eq!(sim.nodes[0].engine.stats().connects_rejected, 1, "seed {s}");
    // 40 source fragments with wrq_sge 2 need 20 WRITEs, over the 16 negotiated.
    let len = 40 * 4096;
    let data = filled(2, len);
    let frags: Vec<Frag> = (0..40).map(|i| Frag { buf: data.clone(), offset: i * 4096, len: 4096 }).collect();
    let sink = Arc::new(Buffer::new(len));
    sim.nodes[1].lnet.post_sink(2, vec![Frag::whole(sink)], len);
    let (a, b) = (nid(0), nid(1));
    let msg =
        LndSend { target: b, hdr: put_hdr(a, b, 2, len), payload: frags.into(), get_sink: None, token: 2 };
    sim.nodes[0].engine.send(sim.now, msg).unwrap();
    let r = sim.wait_send(0, 2, 100_000);
    assert_eq!(r.unwrap_err().errno, Errno::EMSGSIZE, "seed {s}: the caller gets EMSGSIZE");
    sim.run_until(10_000, |sim| {
        sim.gather();
        sim.recvs.contains_key(&(1, 2))
    });
    let r = sim.recvs[&(1, 2)].1.unwrap_err();
    assert_eq!(
        (r.errno, r.health),
        (Errno::EMSGSIZE, Health::RemoteError),
        "seed {s}: the peer gets an error DONE"
    );
    // The connection survives.
    sim.put(0, 1, 3, 100);
    assert!(sim.wait_send(0, 3, 100_000).is_ok(), "seed {s}");
}

#[test]
fn simultaneous_connects_settle_and_deliver_both_ways() {
    for k in 0..10 {
        let s = seed().wrapping_add(k);
        let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
        sim.put(0, 1, 1, 2000);
        sim.put(1, 0, 2, 2000);
        assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
        assert!(sim.wait_send(1, 2, 100_000).is_ok(), "seed {s}");
        let rejected =
            sim.nodes[0].engine.stats().accepts_rejected + sim.nodes[1].engine.stats().accepts_rejected;
        assert!(rejected >= 1, "seed {s}: the race was settled by a CONN_RACE reject");
        assert_eq!(sim.nodes[0].engine.conn_details(nid(1)).len(), 1, "seed {s}: one connection survives");
        assert_eq!(sim.nodes[1].engine.conn_details(nid(0)).len(), 1, "seed {s}");
    }
}

#[test]
fn a_restarted_peer_is_seen_as_stale_and_reconnects() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    // Node 1 restarts with a new incarnation on the same address.
    sim.add_node(1, tunables(), FaultConfig::NONE, SoftConfig::default(), 9999);
    // It connects to node 0, which still holds a connection to the old incarnation.
    sim.put(1, 0, 2, 100);
    assert!(sim.wait_send(1, 2, 200_000).is_ok(), "seed {s}");
    assert!(sim.nodes[0].engine.stats().accepts_rejected >= 1, "seed {s}: CONN_STALE first");
    let d = sim.nodes[0].engine.conn_details(nid(1));
    assert_eq!(d.len(), 1, "seed {s}: the old connection was closed");
    // Node 0 reaches the new incarnation too.
    sim.put(0, 1, 3, 100);
    assert!(sim.wait_send(0, 3, 200_000).is_ok(), "seed {s}");
}

#[test]
fn a_dead_peer_is_detected_within_keepalive_plus_retries() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    let t0 = sim.now;
    sim.net.detach(ip(1)); // node 1's host dies silently
    let keepalive = tunables().keepalive_interval().unwrap();
    let ok = sim.run_until(10_000_000, |sim| sim.nodes[0].engine.conn_details(nid(1)).is_empty());
    assert!(ok, "seed {s}");
    let took = sim.now.saturating_duration_since(t0);
    // A keepalive NOOP goes out after `keepalive` idle seconds; the QP then gives up after
    // retry_count + 1 ACK timeouts (2^14 x 4.096 us each).
    let retries = Duration::from_micros(67_109) * (u32::from(tunables().retry_count) + 2);
    assert!(took >= keepalive && took <= keepalive + retries + Duration::from_secs(1), "seed {s}: {took:?}");
    let p = sim.nodes[0].engine.peers();
    assert_eq!(p[0].state, PeerState::Failed, "seed {s}: {p:?}");
}

/// A peer that hangs up (node 1 closes its connection on request; node 0 gets the DREQ) is
/// idle on both sides, not `Failed` (a failure is what the keepalive test above sees); the
/// next send connects again.
#[test]
fn a_peer_that_hung_up_is_idle_not_failed() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 100);
    assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
    sim.nodes[1].engine.close_peer(sim.now, nid(0));
    let ok = sim.run_until(1_000_000, |sim| sim.nodes[0].engine.conn_details(nid(1)).is_empty());
    assert!(ok, "seed {s}: node 0 saw the hang-up");
    let state = |sim: &Sim, i: usize| sim.nodes[i].engine.peers().first().map(|p| p.state);
    assert_eq!(state(&sim, 0), Some(PeerState::Idle), "seed {s}: the side that got the DREQ");
    assert_eq!(state(&sim, 1), Some(PeerState::Idle), "seed {s}: the side that closed");
    sim.put(0, 1, 2, 100);
    assert!(sim.wait_send(0, 2, 1_000_000).is_ok(), "seed {s}: connects again");
    assert_eq!(state(&sim, 0), Some(PeerState::Connected), "seed {s}");
}

/// `conns_per_peer=2`: the active side opens two connections; closed and reconnected at once,
/// while the closed ones still wait for their flushes, it opens two again (the closing ones
/// used to count as open, so only one came back).
#[test]
fn conns_per_peer_connections_are_opened_and_reopened() {
    let s = seed();
    let tun = {
        let mut t = Tunables { conns_per_peer: 2, ..Tunables::default() };
        t.finalize().unwrap();
        t
    };
    let mut sim = Sim::new(s, 2, &tun, FaultConfig::NONE);
    for tag in 1..=8 {
        sim.put(0, 1, tag, 100);
    }
    for tag in 1..=8 {
        assert!(sim.wait_send(0, tag, 1_000_000).is_ok(), "seed {s}");
    }
    let conns = sim.nodes[0].engine.conn_details(nid(1));
    assert_eq!(conns.len(), 2, "seed {s}: {conns:?}");
    assert_eq!(sim.nodes[1].engine.conn_details(nid(0)).len(), 2, "seed {s}: the passive side has both");
    // Close both and send at once: the closing connections are still there.
    sim.nodes[0].engine.close_peer(sim.now, nid(1));
    sim.put(0, 1, 9, 100);
    assert!(sim.wait_send(0, 9, 1_000_000).is_ok(), "seed {s}");
    let ok = sim.run_until(1_000_000, |sim| sim.nodes[0].engine.conn_details(nid(1)).len() == 2);
    assert!(ok, "seed {s}: two connections again: {:?}", sim.nodes[0].engine.conn_details(nid(1)));
}

/// Node 1 hangs up and restarts with a new incarnation; then both nodes send to each other at
/// once. Node 0's attempt carries the old stamp and the new node 1's REQ tells node 0 of the
/// restart: node 0 drops what it had of the old incarnation but not its own attempt, which the
/// new peer rejects as stale and which then retries. Before, node 0 closed its own attempt on
/// the stale REQ and failed its send with ESTALE.
#[test]
fn a_restarted_peer_connecting_while_we_do_gets_our_send() {
    for k in 0..4 {
        let s = seed().wrapping_add(k);
        let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
        sim.put(0, 1, 1, 100);
        assert!(sim.wait_send(0, 1, 100_000).is_ok(), "seed {s}");
        sim.nodes[1].engine.close_peer(sim.now, nid(0));
        let ok = sim.run_until(1_000_000, |sim| sim.nodes[0].engine.conn_details(nid(1)).is_empty());
        assert!(ok, "seed {s}");
        sim.run_for(Duration::from_secs(1));
        sim.add_node(1, tunables(), FaultConfig::NONE, SoftConfig::default(), 9999);
        sim.put(0, 1, 2, 5000);
        sim.put(1, 0, 3, 5000);
        let r0 = sim.wait_send(0, 2, 1_000_000);
        let r1 = sim.wait_send(1, 3, 1_000_000);
        assert!(r0.is_ok(), "seed {s}: node 0's send to the restarted peer: {r0:?}");
        assert!(r1.is_ok(), "seed {s}: the restarted peer's send: {r1:?}");
    }
}

#[test]
fn transfers_in_flight_to_a_crashed_peer_fail_exactly_once_then_a_restart_works() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    let len = 1 << 20;
    for tag in 1..=4 {
        sim.put(0, 1, tag, len);
    }
    for tag in 5..=8 {
        sim.nodes[1].lnet.post_source(tag, vec![Frag::whole(filled(tag, len))]);
        let dst = Arc::new(Buffer::new(len));
        let (a, b) = (nid(0), nid(1));
        let get = LndSend {
            target: b,
            hdr: get_hdr(a, b, tag, len),
            payload: Frags::new(),
            get_sink: Some(Frag::whole(dst).into()),
            token: tag,
        };
        sim.nodes[0].engine.send(sim.now, get).unwrap();
    }
    // Let the connection come up and the transfers start, then kill node 1 mid-flight.
    sim.run_until(100_000, |sim| {
        sim.nodes[0].engine.stats().rdma_bytes > 0 || sim.nodes[1].engine.stats().rdma_bytes > 0
    });
    sim.net.detach(ip(1));
    let ok = sim.run_until(200_000, |sim| {
        sim.gather();
        (1..=8).all(|t| sim.sends.contains_key(&(0, t)))
    });
    assert!(
        ok,
        "seed {s}: every pending transfer completes: now {:?} done {:?} peers {:?} conns {} txs {:?} stats {:?}",
        sim.now,
        sim.sends.keys().collect::<Vec<_>>(),
        sim.nodes[0].engine.peers(),
        sim.nodes[0].engine.connections(),
        sim.nodes[0].engine.tx_descriptors(),
        sim.nodes[0].engine.stats()
    );
    sim.run_for(Duration::from_secs(5));
    sim.gather();
    for t in 1..=8u64 {
        let (count, r) = sim.sends[&(0, t)];
        assert_eq!(count, 1, "seed {s}: tag {t} completed once");
        let _ = r; // some may have finished before the crash; the rest failed
    }
    let failed = (1..=8u64).filter(|t| sim.sends[&(0, *t)].1.is_err()).count();
    assert!(failed > 0, "seed {s}: the crash interrupted something");
    assert_eq!(sim.nodes[0].engine.tx_descriptors().0, 0, "seed {s}: no descriptor leaked");
    // The host comes back with a new incarnation; traffic flows again.
    sim.add_node(1, tunables(), FaultConfig::NONE, SoftConfig::default(), 7777);
    let sink = sim.put(0, 1, 20, len);
    assert!(sim.wait_send(0, 20, 10_000_000).is_ok(), "seed {s}");
    assert_pattern(&sink, 20, len, s);
}

#[test]
fn no_listener_fails_fast_with_host_unreachable() {
    let s = seed();
    let mut other = tunables();
    other.service = 988;
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.add_node(1, other, FaultConfig::NONE, SoftConfig::default(), 1001);
    let t0 = sim.now;
    sim.put(0, 1, 1, 100);
    let r = sim.wait_send(0, 1, 100_000).unwrap_err();
    assert_eq!((r.errno, r.health), (Errno::EHOSTUNREACH, Health::NetworkTimeout), "seed {s}");
    assert!(sim.now.saturating_duration_since(t0) < Duration::from_millis(10), "seed {s}: one round trip");
}

#[test]
fn no_host_at_all_fails_after_the_connect_timeout() {
    let s = seed();
    let mut sim = Sim::new(s, 1, &tunables(), FaultConfig::NONE);
    let t0 = sim.now;
    let (a, b) = (nid(0), nid(5));
    let msg = put_send(a, b, 1, 10);
    sim.nodes[0].engine.send(sim.now, msg).unwrap();
    let r = sim.wait_send(0, 1, 1_000_000).unwrap_err();
    assert_eq!(r.errno, Errno::ETIMEDOUT, "seed {s}");
    let took = sim.now.saturating_duration_since(t0);
    let limit = tunables().connect_timeout();
    assert!(took <= limit + Duration::from_secs(1), "seed {s}: {took:?} vs {limit:?}");
}

#[test]
fn sixteen_engines_all_to_all_under_loss() {
    let s = seed();
    let n = 16;
    let mut sim = Sim::new(s, n, &tunables(), lossy(0.05));
    let mut tag = 0u64;
    let mut sinks = Vec::new();
    for a in 0..n {
        for b in 0..n {
            if a != b {
                tag += 1;
                sinks.push((tag, a, sim.put(a, b, tag, 3000)));
            }
        }
    }
    let ok = sim.run_until(5_000_000, |sim| {
        sim.gather();
        sim.sends.len() == n * (n - 1)
    });
    assert!(ok, "seed {s}");
    for (tag, a, sink) in sinks {
        assert!(sim.sends[&(a, tag)].1.is_ok(), "seed {s}: tag {tag}");
        assert_pattern(&sink, tag, 3000, s);
    }
    check_credit_invariant(&sim);
}

fn tiny_queue(q: u32) -> Tunables {
    let mut t = tunables();
    // Below o2iblnd's minimum of 8: set directly, as a negotiated depth would be.
    t.peer_credits = q;
    t.peer_credits_hiw = q.saturating_sub(1).max(1);
    t.concurrent_sends = q;
    t
}

#[test]
fn queue_depth_one_and_two_with_many_senders_never_deadlock() {
    for q in [1, 2] {
        let s = seed().wrapping_add(u64::from(q));
        let mut sim = Sim::new(s, 6, &tiny_queue(q), lossy(0.01));
        let mut w = Workload::new(s, 1500, 64, 300_000);
        w.run(&mut sim, 20_000_000);
        assert_eq!((w.verified, w.failed), (1500, 0), "seed {s} q {q}");
        settle_and_check(&mut sim);
    }
}

#[test]
fn noops_return_credits_to_a_one_way_stream_at_the_high_water_mark() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    let n = 2000u64;
    let mut sent = 0u64;
    let mut top_up = |sim: &mut Sim| {
        sim.gather();
        let done = sim.sends.len() as u64;
        while sent < n && sent - done < 32 {
            sent += 1;
            sim.put(0, 1, sent, 1000);
        }
        done == n
    };
    top_up(&mut sim);
    let ok = sim.run_until(2_000_000, top_up);
    assert!(ok, "seed {s}");
    assert!((1..=n).all(|t| sim.sends[&(0, t)].1.is_ok()), "seed {s}");
    // Node 1 sends nothing but NOOPs; each carries at least hiw = Q/2 = 4 credits.
    let noops = sim.nodes[1].engine.stats().noops;
    let hiw = u64::from(tunables().peer_credits_hiw_for(8));
    assert!(noops > 0 && noops <= n / hiw + 2, "seed {s}: {noops} NOOPs for {n} messages at hiw {hiw}");
    assert!(sim.nodes[0].engine.stats().credit_stalls > 0, "seed {s}: the stream did wait for credits");
    settle_and_check(&mut sim);
}

#[test]
fn regression_zero_length_get_is_one_empty_fragment() {
    // A GET with an empty sink went out as GET_REQ with no RDMA fragment, which the peer
    // refused as malformed (o2iblnd descriptors carry 1..=257 fragments), closing the link.
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.nodes[1].lnet.post_source(3, vec![]);
    let (a, b) = (nid(0), nid(1));
    let get = LndSend {
        target: b,
        hdr: get_hdr(a, b, 3, 0),
        payload: Frags::new(),
        get_sink: Some(Frags::new()),
        token: 3,
    };
    sim.nodes[0].engine.send(sim.now, get).unwrap();
    assert_eq!(
        sim.wait_send(0, 3, 100_000),
        Ok(lnet_shim::lnd::SendStatus { reply_len: Some(0) }),
        "seed {s}"
    );
    assert_eq!(sim.nodes[1].engine.stats().protocol_errors, 0, "seed {s}");
    assert_eq!(sim.nodes[0].engine.conn_details(nid(1)).len(), 1, "seed {s}: the connection stays up");
}

/// Node 0's descriptor pool (`ntx` 16) is empty while it owes node 1 credits for a stream of
/// IMMEDIATEs: 14 sends wait for a connection to a dead node 3 and 2 PUT_ACKs for node 2, which
/// then goes silent. Its NOOP finds no descriptor. The descriptors come back on *other*
/// connections (node 2's dies, node 3's connect times out); the NOOP must then go, or node 1
/// stays without credits until node 0's keepalive (100 s), after its own sends expired (50 s).
#[test]
fn a_starved_noop_goes_when_a_descriptor_frees_on_another_connection() {
    let s = seed();
    let mut t = tunables();
    t.ntx = 16;
    t.finalize().unwrap();
    let dead = FaultConfig::symmetric(DirFaults { drop: 1.0, ..DirFaults::NONE });
    let mut sim = Sim::new(s, 4, &t, FaultConfig::NONE);
    sim.nodes[3].engine.device().set_faults(dead);
    sim.put(1, 0, 1, 8);
    sim.put(2, 0, 2, 8);
    assert!(sim.wait_send(1, 1, 100_000).is_ok(), "seed {s}");
    assert!(sim.wait_send(2, 2, 100_000).is_ok(), "seed {s}");
    for tag in 100..114 {
        sim.put(0, 3, tag, 8);
    }
    sim.step();
    assert_eq!(sim.nodes[0].engine.slots.available(), 2, "seed {s}: the reply reserve is left");
    sim.put(2, 0, 200, 65536);
    sim.put(2, 0, 201, 65536);
    assert!(sim.run_until(10_000, |sim| sim.nodes[0].engine.slots.available() == 0), "seed {s}");
    sim.nodes[2].engine.device().set_faults(dead);
    for tag in 1000..1040 {
        sim.put(1, 0, tag, 100);
    }
    sim.run_for(Duration::from_secs(45));
    sim.gather();
    let ok = (1000..1040).filter(|t| sim.sends.get(&(1, *t)).is_some_and(|r| r.1.is_ok())).count();
    assert_eq!(ok, 40, "seed {s}: node 1's stream stalled without credits");
    assert_eq!(sim.nodes[1].engine.stats().tx_timeouts, 0, "seed {s}");
}
