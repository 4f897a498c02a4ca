//! How long a sink's key lets the peer write (`fmr_cache`, [`crate::engine::sink`]). Node 1's
//! wire rewrites the RDMA ETH of its own WRITEs (and reseals the ICRC): a source that keeps a
//! key after its transfer ended, or writes past the bytes a descriptor named.

use std::sync::Arc;
use std::time::Duration;

use lnet_shim::buffer::Buffer;
use lnet_shim::event::Errno;
use lnet_shim::lnd::Frag;

use super::hostile::{Tamper, WriteRule, sim_with_tamper};
use super::*;
use crate::fabric::soft::{DirFaults, FaultConfig, SoftConfig};

const LEN: usize = 8192;

fn tunables_with_fmr_cache(on: bool) -> Tunables {
    let mut t = tunables();
    t.fmr_cache = on;
    t
}

/// Node 1's WRITEs of its first transfer pass; every later one is sent with the first
/// transfer's key and address instead of its own.
fn reuse_the_first_key() -> WriteRule {
    let mut first = None;
    Box::new(move |reth| {
        let (va, rkey) = *first.get_or_insert((reth.va, reth.rkey));
        if (reth.va, reth.rkey) == (va, rkey) {
            return false;
        }
        (reth.va, reth.rkey) = (va, rkey);
        true
    })
}

/// Node 1 PUTs `LEN` bytes into sink `a` at node 0 (tunables `fmr_cache=on` there), then
/// `LEN` more into sink `b` with the first transfer's key (its WRITE rewritten). Returns the
/// sim, both sinks, and how the second transfer ended at each side.
#[allow(clippy::type_complexity)]
fn second_put_with_the_first_key(
    s: u64,
    on: bool,
) -> (Sim, Arc<Buffer>, Arc<Buffer>, Result<SendStatus, LndError>, Result<usize, LndError>) {
    let mut sim = sim_with_tamper(s, Tamper { write_rule: Some(reuse_the_first_key()), ..Tamper::default() });
    sim.add_node(0, tunables_with_fmr_cache(on), FaultConfig::NONE, SoftConfig::default(), 1000);
    let a = sim.put(1, 0, 1, LEN);
    assert!(sim.wait_send(1, 1, 1_000_000).is_ok(), "seed {s}");
    let got_a = sim.run_until(1_000_000, |sim| {
        sim.gather();
        sim.recvs.contains_key(&(0, 1))
    });
    assert!(got_a && sim.recvs[&(0, 1)] == (1, Ok(LEN)), "seed {s}: {:?}", sim.recvs.get(&(0, 1)));
    assert_eq!(a.to_vec(0, LEN).unwrap(), filled(1, LEN).to_vec(0, LEN).unwrap(), "seed {s}");
    let b = sim.put(1, 0, 2, LEN);
    let sent = sim.wait_send(1, 2, 2_000_000);
    let ended = sim.run_until(2_000_000, |sim| {
        sim.gather();
        sim.recvs.contains_key(&(0, 2))
    });
    assert!(ended, "seed {s}: node 0's receive of the second PUT never ended");
    let (n, recv) = sim.recvs[&(0, 2)];
    assert_eq!(n, 1, "seed {s}: the receive ended exactly once");
    (sim, a, b, sent, recv)
}

/// The default, o2iblnd's `fmr_cache=1`: a sink's registration is cached for the buffer's
/// life, so the first transfer's key still writes its buffer after that transfer ended. This
/// is the hazard `fmr_cache=0` removes; it also shows that the rewrite below really sends the
/// stale key.
#[test]
fn with_fmr_cache_a_finished_transfers_key_still_writes_its_buffer() {
    let s = seed();
    let (sim, a, b, sent, recv) = second_put_with_the_first_key(s, true);
    assert!(sent.is_ok() && recv == Ok(LEN), "seed {s}: {sent:?} {recv:?}");
    assert_eq!(a.to_vec(0, LEN).unwrap(), filled(2, LEN).to_vec(0, LEN).unwrap(), "seed {s}: a overwritten");
    assert!(b.to_vec(0, LEN).unwrap().iter().all(|&x| x == 0), "seed {s}: b never written");
    assert_eq!(sim.nodes[0].engine.stats().sink_registrations, 0, "seed {s}");
}

/// `fmr_cache=0`: the first transfer's region was deregistered when it ended, so the WRITE
/// with its key is refused at node 0 (REM_ACCESS_ERR, nothing written), node 1's PUT fails,
/// and node 0's receive fails instead of reporting bytes that never came.
#[test]
fn without_fmr_cache_a_finished_transfers_key_writes_nothing() {
    let s = seed();
    let (mut sim, a, b, sent, recv) = second_put_with_the_first_key(s, false);
    assert!(sent.is_err() && recv.is_err(), "seed {s}: {sent:?} {recv:?}");
    assert_eq!(a.to_vec(0, LEN).unwrap(), filled(1, LEN).to_vec(0, LEN).unwrap(), "seed {s}: a untouched");
    assert!(b.to_vec(0, LEN).unwrap().iter().all(|&x| x == 0), "seed {s}: b untouched");
    assert!(sim.nodes[0].engine.device().stats().access_errors >= 1, "seed {s}");
    assert_eq!(sim.nodes[0].engine.stats().sink_registrations, 2, "seed {s}");
    // Node 0 still serves node 2.
    let c = sim.put(2, 0, 3, LEN);
    assert!(sim.wait_send(2, 3, 1_000_000).is_ok(), "seed {s}");
    sim.run_for(Duration::from_millis(10));
    assert_eq!(c.to_vec(0, LEN).unwrap(), filled(3, LEN).to_vec(0, LEN).unwrap(), "seed {s}");
}

/// `fmr_cache=0` registers exactly the bytes the descriptor names: a sink MD that matches
/// the first half of a buffer exposes only that half. A WRITE aimed at the second half with
/// the transfer's own key is refused; with the cached registration of the whole buffer it
/// lands.
#[test]
fn without_fmr_cache_only_the_named_bytes_are_writable() {
    for on in [true, false] {
        let s = seed();
        let shift: WriteRule = Box::new(|reth| {
            reth.va += LEN as u64;
            true
        });
        let mut sim = sim_with_tamper(s, Tamper { write_rule: Some(shift), ..Tamper::default() });
        sim.add_node(0, tunables_with_fmr_cache(on), FaultConfig::NONE, SoftConfig::default(), 1000);
        let sink = Arc::new(Buffer::new(2 * LEN));
        sim.put_into(1, 0, 1, LEN, &sink, LEN);
        let sent = sim.wait_send(1, 1, 2_000_000);
        let second_half_written = sink.to_vec(LEN, LEN).unwrap().iter().any(|&x| x != 0);
        assert_eq!(second_half_written, on, "seed {s}: fmr_cache={on} {sent:?}");
        assert_eq!(sent.is_ok(), on, "seed {s}: fmr_cache={on} {sent:?}");
        assert!(sink.to_vec(0, LEN).unwrap().iter().all(|&x| x == 0), "seed {s}: the named half unwritten");
    }
}

/// Mixed PUTs and GETs under loss with `fmr_cache=0` on both sides: every byte verified, a
/// registration per sink, and none left once the buffers are gone.
#[test]
fn without_fmr_cache_mixed_transfers_verify_and_leave_no_registration() {
    let s = seed();
    let faults =
        FaultConfig { tx: DirFaults { drop: 0.01, reorder: 0.01, ..DirFaults::NONE }, rx: DirFaults::NONE };
    let mut sim = Sim::new(s, 2, &tunables_with_fmr_cache(false), faults);
    // Connected (a connection registers its receive buffers); an IMMEDIATE registers nothing.
    sim.put(0, 1, u64::MAX, 100);
    assert!(sim.wait_send(0, u64::MAX, 1_000_000).is_ok(), "seed {s}");
    let baseline: Vec<u32> = sim.nodes.iter().map(|n| n.engine.device().live_counts().mrs).collect();
    let mut w = Workload::new(s, 2_000, 16, 1 << 20);
    w.run(&mut sim, 20_000_000);
    assert_eq!((w.verified, w.failed), (2_000, 0), "seed {s}");
    assert_write_path(&sim);
    settle_and_check(&mut sim);
    drop(w);
    let regs: u64 = sim.nodes.iter().map(|n| n.engine.stats().sink_registrations).sum();
    assert!(regs > 500, "seed {s}: {regs} sink registrations");
    let now: Vec<u32> = sim.nodes.iter().map(|n| n.engine.device().live_counts().mrs).collect();
    assert_eq!(now, baseline, "seed {s}: registrations left behind");
}

/// A sink fragment that LNet built past the end of its buffer is refused before anything is
/// registered or written, with either setting: the receive fails with `-EINVAL` and the source
/// is NAKed (its PUT fails), and the buffer is untouched.
#[test]
fn a_sink_fragment_outside_its_buffer_is_refused_before_anything_is_registered() {
    for on in [true, false] {
        let s = seed();
        let mut sim = Sim::new(s, 2, &tunables_with_fmr_cache(on), FaultConfig::NONE);
        let buf = Arc::new(Buffer::new(LEN));
        let frag = Frag { buf: buf.clone(), offset: LEN / 2, len: LEN };
        sim.nodes[1].lnet.post_sink(1, vec![frag], LEN);
        let (from, to) = (sim.nodes[0].nid, sim.nodes[1].nid);
        let msg = put_send(from, to, 1, LEN);
        sim.nodes[0].engine.send(sim.now, msg).unwrap();
        let sent = sim.wait_send(0, 1, 1_000_000);
        assert!(sent.is_err(), "seed {s}: fmr_cache={on}: {sent:?}");
        sim.run_for(Duration::from_millis(1));
        sim.gather();
        let got = sim.recvs.get(&(1, 1)).map(|&(n, r)| (n, r.map_err(|e| e.errno)));
        assert_eq!(got, Some((1, Err(Errno::EINVAL))), "seed {s}: fmr_cache={on}");
        assert!(buf.to_vec(0, LEN).unwrap().iter().all(|&x| x == 0), "seed {s}: untouched");
        assert_eq!(sim.nodes[1].engine.stats().sink_registrations, 0, "seed {s}");
    }
}
