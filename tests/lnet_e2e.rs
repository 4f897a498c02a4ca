//! LNet end to end over the real o2iblnd driver: two `Lnet`s in this process, on
//! 127.0.0.1@o2ib and 127.0.0.2@o2ib, each with an `lnd::driver::Driver` on the software fabric
//! (real UDP sockets, a port of this test's own).
//!
//! `LNET_E2E_SEED=<n>` replays the randomised test; failures name the seed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lnd::driver::{Driver, DriverConfig, FabricChoice};
use lnd::fabric::soft::SoftConfig;
use lnd::tunables::Tunables;
use lnd_tests::unique_port;
use lnet_shim::buffer::Buffer;
use lnet_shim::event::{Errno, Event, EventKind, EventQueue};
use lnet_shim::frags::Frag;
use lnet_shim::lnd::Lnd;
use lnet_shim::matching::{ANY_PROCESS, MatchEntry, MdHandle, MdOptions, Threshold, Unlink};
use lnet_shim::nid::{Nid, ProcessId};
use lnet_shim::{AckReq, Lnet, LnetConfig, Md};

const WAIT: Duration = Duration::from_secs(60);
const PORTAL: u32 = 8;

struct Node {
    lnet: Lnet,
    nid: Nid,
    driver: Arc<Driver>,
}

impl Node {
    fn start(addr: &str, port: u16) -> Node {
        Node::start_with(addr, port, 0)
    }

    /// A node with `nscheds` scheduler threads (0: automatic).
    fn start_with(addr: &str, port: u16, nscheds: u32) -> Node {
        Node::start_tuned(addr, port, Tunables { nscheds, ..Tunables::default() })
    }

    /// A node with these tunables.
    fn start_tuned(addr: &str, port: u16, tunables: Tunables) -> Node {
        Node::start_lnet(addr, port, tunables, LnetConfig::default())
    }

    /// A node with these tunables and this LNet configuration.
    fn start_lnet(addr: &str, port: u16, mut tunables: Tunables, lnet_config: LnetConfig) -> Node {
        let nid: Nid = format!("{addr}@o2ib").parse().unwrap();
        tunables.finalize().unwrap();
        let (credits, peer_credits) = (tunables.credits, tunables.peer_credits);
        let config = DriverConfig {
            nid,
            tunables,
            fabric: FabricChoice::Soft(SoftConfig { udp_port: port, ..SoftConfig::default() }),
            seed: None,
        };
        let lnet = Lnet::new(lnet_config).unwrap();
        let mut driver = None;
        lnet.add_ni(nid, credits, peer_credits, |up| {
            let d = Arc::new(Driver::start(config, up)?);
            driver = Some(d.clone());
            Ok::<_, lnd::driver::DriverError>(d as Arc<dyn Lnd>)
        })
        .unwrap_or_else(|e| panic!("cannot start {nid}: {e}"));
        Node { lnet, nid, driver: driver.expect("the driver started") }
    }

    fn pid(&self) -> ProcessId {
        ProcessId::new(self.nid, ProcessId::PID_LUSTRE)
    }
}

/// Two nodes on a port of their own (`offset` keeps the tests of this process apart).
fn pair(offset: u16) -> (Node, Node) {
    let port = unique_port(offset);
    (Node::start("127.0.0.1", port), Node::start("127.0.0.2", port))
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn buf(data: &[u8]) -> Arc<Buffer> {
    Arc::new(Buffer::from_slice(data))
}

fn next(q: &EventQueue) -> Event {
    q.wait(WAIT).expect("an event within the wait")
}

fn post(n: &Node, bits: u64, b: Arc<Buffer>, options: MdOptions, q: &EventQueue) -> MdHandle {
    let md = Md::contiguous(b).with_options(options).with_events(q.clone());
    n.lnet.attach(PORTAL, MatchEntry::new(ANY_PROCESS, bits), md, Unlink::Retain).unwrap().1
}

fn bind(n: &Node, b: Arc<Buffer>, ops: u32, q: &EventQueue) -> MdHandle {
    let md = Md::contiguous(b).with_threshold(Threshold::Count(ops)).with_events(q.clone());
    n.lnet.md_bind(md, Unlink::Auto).unwrap()
}

#[test]
fn put_with_ack_immediate_and_rdma() {
    let (a, b) = pair(0);
    for (i, len) in [200usize, 1 << 20].into_iter().enumerate() {
        let bits = 10 + i as u64;
        let (qa, qb) = (EventQueue::new(8), EventQueue::new(8));
        let sink = Arc::new(Buffer::new(len));
        post(&b, bits, sink.clone(), MdOptions::OP_PUT, &qb);
        let data = pattern(bits, len);
        let h = bind(&a, buf(&data), 2, &qa);
        a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, bits, 0, 0xabc).unwrap();
        let put = next(&qb);
        assert_eq!(
            (put.kind, put.status, put.mlength, put.hdr_data),
            (EventKind::Put, Ok(()), len as u64, 0xabc)
        );
        assert!(sink.to_vec(0, len).unwrap() == data, "PUT of {len} bytes corrupt");
        let (send, ack) = (next(&qa), next(&qa));
        assert_eq!((send.kind, send.status), (EventKind::Send, Ok(())), "len {len}");
        assert_eq!(
            (ack.kind, ack.status, ack.mlength, ack.unlinked),
            (EventKind::Ack, Ok(()), len as u64, true)
        );
    }
    let s = b.lnet.stats();
    let peer = s.ni(b.nid).unwrap().peer(a.nid).unwrap().clone();
    assert_eq!(peer.counters.recv_bytes, 200 + (1 << 20));
    let lnd = peer.lnd.expect("the LND reports the peer");
    assert_eq!(lnd.state, lnet_shim::lnd::PeerState::Connected, "{s}");
}

/// PUTs larger than the target's MD, which has `TRUNCATE`: IMMEDIATE (200 into 100) and by
/// RDMA (5000 into 4096, 64 KiB into 8 KiB). The MD gets its first bytes, the ACK reports
/// the matched length, and nothing past the MD is written.
#[test]
fn puts_into_a_truncating_md_deliver_what_it_holds() {
    let (a, b) = pair(7);
    for (i, (len, cap)) in [(200usize, 100usize), (5000, 4096), (64 << 10, 8 << 10)].into_iter().enumerate() {
        let bits = 20 + i as u64;
        let (qa, qb) = (EventQueue::new(8), EventQueue::new(8));
        // One byte more than the MD: the buffer past it stays zero.
        let mem = Arc::new(Buffer::new(cap + 1));
        let md = Md::new(Frag { buf: mem.clone(), offset: 0, len: cap })
            .with_options(MdOptions::OP_PUT | MdOptions::TRUNCATE)
            .with_events(qb.clone());
        b.lnet.attach(PORTAL, MatchEntry::new(ANY_PROCESS, bits), md, Unlink::Retain).unwrap();
        let data = pattern(bits, len);
        let h = bind(&a, buf(&data), 2, &qa);
        a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, bits, 0, 0).unwrap();
        let put = next(&qb);
        assert_eq!(
            (put.kind, put.status, put.mlength, put.rlength),
            (EventKind::Put, Ok(()), cap as u64, len as u64)
        );
        let got = mem.to_vec(0, cap + 1).unwrap();
        assert!(got[..cap] == data[..cap], "PUT of {len} into {cap}: corrupt");
        assert_eq!(got[cap], 0, "PUT of {len} into {cap}: written past the MD");
        let (send, ack) = (next(&qa), next(&qa));
        assert_eq!((send.kind, send.status), (EventKind::Send, Ok(())), "len {len}");
        assert_eq!((ack.kind, ack.status, ack.mlength), (EventKind::Ack, Ok(()), cap as u64), "len {len}");
    }
}

/// `Lnet::stats` from an event callback, which runs on the LND's scheduler thread: that thread
/// cannot answer a query it waits for, so its own scheduler answers from the peer list it
/// shared last (here refreshed by the query from the test thread). Before, the call queued the
/// query on its own thread and waited 5 s for it, stalling every peer of the scheduler, and
/// came back without them.
#[test]
fn stats_from_an_event_callback_answer_at_once() {
    use lnet_shim::event::EventSink;
    // Addresses of their own: every port offset of this process is taken.
    let port = unique_port(0);
    let (a, b) = (Node::start("127.0.0.5", port), Node::start("127.0.0.6", port));
    ping_pong(&a, &b, 1, 1);
    assert_eq!(
        b.lnet.stats().ni(b.nid).unwrap().peer(a.nid).and_then(|p| p.lnd.clone()).map(|l| l.state),
        Some(lnet_shim::lnd::PeerState::Connected)
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let (lnet_b, a_nid) = (b.lnet.clone(), a.nid);
    let tx = std::sync::Mutex::new(tx);
    let sink = EventSink::callback(move |e: &Event| {
        if e.kind == EventKind::Put {
            #[allow(
                clippy::disallowed_methods,
                reason = "how long the call blocks is what this test measures"
            )]
            let t = std::time::Instant::now();
            let st = lnet_b.stats();
            let seen = st.nis.iter().any(|n| n.peers.iter().any(|p| p.nid == a_nid && p.lnd.is_some()));
            let _ = tx.lock().unwrap().send((t.elapsed(), seen));
        }
    });
    let md = Md::contiguous(Arc::new(Buffer::new(64))).with_options(MdOptions::OP_PUT).with_events(sink);
    b.lnet.attach(PORTAL, MatchEntry::new(ANY_PROCESS, 77), md, Unlink::Retain).unwrap();
    let qa = EventQueue::new(8);
    let h = bind(&a, buf(&pattern(77, 64)), 2, &qa);
    a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 77, 0, 0).unwrap();
    let (took, seen) = rx.recv_timeout(WAIT).expect("the callback ran");
    assert!(took < Duration::from_secs(1), "the callback's stats query took {took:?}");
    assert!(seen, "the callback's stats show the LND's peer");
    assert_eq!((next(&qa).kind, next(&qa).kind), (EventKind::Send, EventKind::Ack));
}

#[test]
fn get_reply_of_one_mib() {
    let (a, b) = pair(1);
    let len = 1 << 20;
    let data = pattern(77, len);
    let (qa, qb) = (EventQueue::new(8), EventQueue::new(8));
    post(&b, 5, buf(&data), MdOptions::OP_GET, &qb);
    let sink = Arc::new(Buffer::new(len));
    let h = bind(&a, sink.clone(), 2, &qa);
    a.lnet.get(h, b.pid(), PORTAL, 5, 0).unwrap();
    let (send, reply) = (next(&qa), next(&qa));
    assert_eq!((send.kind, send.status), (EventKind::Send, Ok(())));
    assert_eq!(
        (reply.kind, reply.status, reply.mlength, reply.unlinked),
        (EventKind::Reply, Ok(()), len as u64, true)
    );
    assert!(sink.to_vec(0, len).unwrap() == data, "GET data corrupt");
    let get = next(&qb);
    assert_eq!((get.kind, get.status, get.mlength), (EventKind::Get, Ok(()), len as u64));
    assert_eq!(a.lnet.stats().mds, 0);
}

#[test]
fn no_match_drop_is_seen_by_both_sides() {
    let (a, b) = pair(2);
    let q = EventQueue::new(32);
    // Small PUT with ACK: the drop NAK ACK.
    a.lnet.put(bind(&a, buf(&[1; 100]), 2, &q), AckReq::Ack, b.pid(), PORTAL, 1, 0, 0).unwrap();
    let (send, ack) = (next(&q), next(&q));
    assert_eq!((send.kind, send.status), (EventKind::Send, Ok(())));
    assert_eq!((ack.kind, ack.status), (EventKind::Ack, Err(Errno::ENODATA)));
    // Large PUT: PUT_NAK(-ENODATA) from the LND.
    a.lnet.put(bind(&a, buf(&pattern(2, 1 << 20)), 1, &q), AckReq::NoAck, b.pid(), PORTAL, 2, 0, 0).unwrap();
    let send = next(&q);
    assert_eq!((send.kind, send.status), (EventKind::Send, Err(Errno::ENODATA)));
    // GET: GET_DONE(-ENODATA).
    a.lnet.get(bind(&a, Arc::new(Buffer::new(4096)), 2, &q), b.pid(), PORTAL, 3, 0).unwrap();
    let (send, reply) = (next(&q), next(&q));
    assert_eq!((send.kind, send.status), (EventKind::Send, Err(Errno::ENODATA)));
    assert_eq!((reply.kind, reply.status), (EventKind::Reply, Err(Errno::ENODATA)));
    let s = b.lnet.stats();
    let ni = s.ni(b.nid).unwrap();
    assert_eq!(ni.drops.no_match, 3, "{s}");
    assert_eq!(ni.peer(a.nid).unwrap().counters.drop_count, 3, "{s}");
    assert_eq!(ni.counters.drop_bytes, 100 + (1 << 20), "{s}");
    let sa = a.lnet.stats();
    assert_eq!(sa.ni(a.nid).unwrap().counters.send_errors, 2, "{sa}");
}

/// Response timeouts over the real o2iblnd: PUTs whose target never acknowledges (its MD has
/// `ACK_DISABLE`), IMMEDIATE and by RDMA, land at the target, and the initiator's LNet gives
/// their ACKs up after its transaction timeout with `-ETIMEDOUT`, unlinking the MDs. The
/// connection is untouched: a PUT with ACK afterwards is acknowledged as usual.
#[test]
fn acks_that_never_come_time_out_and_the_connection_goes_on() {
    let port = unique_port(0);
    let quick = LnetConfig { transaction_timeout: Some(Duration::from_millis(300)), ..LnetConfig::default() };
    let a = Node::start_lnet("127.0.0.16", port, Tunables::default(), quick);
    let b = Node::start("127.0.0.17", port);
    let (qa, qb) = (EventQueue::new(16), EventQueue::new(16));
    for (i, len) in [200usize, 1 << 20].into_iter().enumerate() {
        let bits = 40 + i as u64;
        let sink = Arc::new(Buffer::new(len));
        post(&b, bits, sink.clone(), MdOptions::OP_PUT | MdOptions::ACK_DISABLE, &qb);
        let data = pattern(bits, len);
        let h = a.lnet.md_bind(Md::contiguous(buf(&data)).with_events(qa.clone()), Unlink::Retain).unwrap();
        a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, bits, 0, 0).unwrap();
        let put = next(&qb);
        assert_eq!((put.kind, put.status, put.mlength), (EventKind::Put, Ok(()), len as u64));
        assert!(sink.to_vec(0, len).unwrap() == data, "PUT of {len} bytes corrupt");
        let send = next(&qa);
        assert_eq!((send.kind, send.status), (EventKind::Send, Ok(())), "len {len}");
        let ack = next(&qa);
        assert_eq!(
            (ack.kind, ack.status, ack.md_handle),
            (EventKind::Ack, Err(Errno::ETIMEDOUT), h),
            "len {len}"
        );
        // The MD goes with an UNLINK event, or (when the SEND was still in flight at the
        // timeout, on a loaded machine) with the ACK itself.
        if !ack.unlinked {
            let unlink = next(&qa);
            assert_eq!((unlink.kind, unlink.unlinked), (EventKind::Unlink, true), "len {len}");
        }
    }
    assert_eq!(a.lnet.stats().response_timeouts, 2);
    let sink = Arc::new(Buffer::new(100));
    post(&b, 50, sink, MdOptions::OP_PUT, &qb);
    a.lnet.put(bind(&a, buf(&[9; 100]), 2, &qa), AckReq::Ack, b.pid(), PORTAL, 50, 0, 0).unwrap();
    let (send, ack) = (next(&qa), next(&qa));
    assert_eq!(
        (send.kind, send.status, ack.kind, ack.status),
        (EventKind::Send, Ok(()), EventKind::Ack, Ok(()))
    );
    assert_eq!(next(&qb).kind, EventKind::Put);
    assert_eq!(a.lnet.stats().response_timeouts, 2);
}

/// A server's lazy request portal (`Lnet::set_lazy_portal`): PUTs that arrive before any buffer
/// is posted, IMMEDIATE and by RDMA, wait in LNet and land, every byte, in the buffers posted
/// after them; their ACKs come then. The same PUTs to a portal that is not lazy are dropped.
#[test]
fn puts_to_a_lazy_portal_wait_for_the_buffers_posted_after_them() {
    let port = unique_port(0);
    let (a, b) = (Node::start("127.0.0.14", port), Node::start("127.0.0.15", port));
    b.lnet.set_lazy_portal(PORTAL).unwrap();
    let (qa, qb) = (EventQueue::new(16), EventQueue::new(16));
    let lens = [200usize, 1 << 20];
    for (i, &len) in lens.iter().enumerate() {
        let h = bind(&a, buf(&pattern(40 + i as u64, len)), 2, &qa);
        a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 40 + i as u64, 0, 0).unwrap();
    }
    // Both SENDs end well (the RDMA PUT's data is in the target's LNet); no ACK yet.
    for _ in lens {
        let e = next(&qa);
        assert_eq!((e.kind, e.status), (EventKind::Send, Ok(())));
    }
    // The IMMEDIATE one is acknowledged by the device before LNet has seen it: wait until
    // both wait there, for at most 1000 of the target's scheduler turns (each `stats` answer
    // comes from a turn that began after the question).
    let waiting = (0..1000).find_map(|_| {
        b.driver.stats().expect("the scheduler answers");
        Some(b.lnet.stats().lazy.waiting).filter(|&n| n == lens.len())
    });
    assert_eq!(waiting, Some(lens.len()), "the PUTs never all reached the lazy portal");
    assert!(qa.wait(Duration::from_millis(100)).is_none(), "an ACK before the buffers were posted");
    let sinks: Vec<Arc<Buffer>> = lens.iter().map(|&len| Arc::new(Buffer::new(len))).collect();
    for (i, sink) in sinks.iter().enumerate() {
        post(&b, 40 + i as u64, sink.clone(), MdOptions::OP_PUT, &qb);
    }
    for (i, &len) in lens.iter().enumerate() {
        let e = next(&qb);
        assert_eq!(
            (e.kind, e.status, e.mlength, e.match_bits),
            (EventKind::Put, Ok(()), len as u64, 40 + i as u64)
        );
        assert!(
            sinks[i].to_vec(0, len).unwrap() == pattern(40 + i as u64, len),
            "PUT of {len} bytes corrupt"
        );
        let ack = next(&qa);
        assert_eq!((ack.kind, ack.status, ack.mlength), (EventKind::Ack, Ok(()), len as u64));
    }
    let s = b.lnet.stats();
    assert_eq!((s.lazy.waiting, s.lazy.delayed, s.lazy.resumed), (0, 2, 2), "{s}");
    assert_eq!(s.ni(b.nid).unwrap().drops.total(), 0, "{s}");
    // Not lazy any more: the same PUTs are dropped, as on any portal.
    b.lnet.clear_lazy_portal(PORTAL).unwrap();
    for (i, &len) in lens.iter().enumerate() {
        let h = bind(&a, buf(&pattern(50 + i as u64, len)), 2, &qa);
        a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 50 + i as u64, 0, 0).unwrap();
        let (e1, e2) = (next(&qa), next(&qa));
        assert!(e1.status == Err(Errno::ENODATA) || e2.status == Err(Errno::ENODATA), "{e1:?} {e2:?}");
    }
    assert_eq!(b.lnet.stats().ni(b.nid).unwrap().drops.no_match, 2);
}

/// Asks `n`'s schedulers for their counters until `done` holds (a bounded number of times:
/// each answer comes from a scheduler turn that began after the previous question).
fn until_engine(n: &Node, what: &str, done: impl Fn(&lnd::engine::EngineStats) -> bool) {
    for _ in 0..1000 {
        if done(&n.driver.stats().expect("the scheduler answers").engine) {
            return;
        }
    }
    panic!("{}: {what} never seen: {:?}", n.nid, n.driver.stats());
}

/// The port's link goes down under a running interface (`PORT_ERR`): LNet's PUT fails at once
/// with `-ENETDOWN`, both for the send event and the ACK it waited for; the link returns
/// (`PORT_ACTIVE`) and the next PUT goes through on the same connection.
#[test]
fn a_port_that_goes_down_fails_puts_at_once_and_one_that_returns_carries_them_again() {
    let port = unique_port(0);
    let (a, b) = (Node::start("127.0.0.7", port), Node::start("127.0.0.8", port));
    let q = EventQueue::new(32);
    let sink = Arc::new(Buffer::new(4096));
    let put = |bits: u64| {
        a.lnet
            .put(bind(&a, buf(&pattern(bits, 1000)), 2, &q), AckReq::Ack, b.pid(), PORTAL, bits, 0, 0)
            .unwrap();
    };
    let qb = EventQueue::new(8);
    post(&b, 1, Arc::new(Buffer::new(1000)), MdOptions::OP_PUT, &qb);
    put(1);
    let (send, ack) = (next(&q), next(&q));
    assert_eq!((send.status, ack.status), (Ok(()), Ok(())));
    let conns = a.driver.stats().unwrap().engine.conns_established;

    assert!(a.driver.set_soft_port_state(lnd::fabric::PortState::Down), "the software fabric");
    until_engine(&a, "PORT_ERR", |e| e.port_errors == 1);
    assert_eq!(a.driver.link(), lnd::engine::LinkState::Down);
    let st = a.lnet.stats();
    assert!(st.ni(a.nid).unwrap().fatal_error, "LNet shows the NI's fatal error: {st}");
    assert!(st.to_string().contains("fatal error"), "{st}");
    put(2);
    let (send, ack) = (next(&q), next(&q));
    assert_eq!((send.kind, send.status), (EventKind::Send, Err(Errno::ENETDOWN)));
    assert_eq!((ack.kind, ack.status), (EventKind::Ack, Err(Errno::ENETDOWN)));

    assert!(a.driver.set_soft_port_state(lnd::fabric::PortState::Active));
    post(&b, 3, sink.clone(), MdOptions::OP_PUT, &qb);
    until_engine(&a, "PORT_ACTIVE", |e| e.port_recoveries == 1);
    assert!(!a.lnet.stats().ni(a.nid).unwrap().fatal_error);
    put(3);
    let (send, ack) = (next(&q), next(&q));
    assert_eq!((send.status, ack.status), (Ok(()), Ok(())));
    assert!(sink.to_vec(0, 1000).unwrap() == pattern(3, 1000));
    let e = a.driver.stats().unwrap().engine;
    assert_eq!((e.conns_established, e.sends_refused_link), (conns, 1), "{e:?}");
}

/// With two schedulers sharing the device, both hear the port go down and come back (the
/// device's async events go to every shard), so a send refused by one is refused by all.
#[test]
fn every_scheduler_hears_the_port_go_down_and_come_back() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        println!("skipped: nscheds is capped at the CPUs, and this machine has one");
        return;
    }
    let a = Node::start_with("127.0.0.11", unique_port(0), 2);
    let per_shard = |a: &Node| -> Vec<(u64, u64)> {
        let stats = a.driver.scheduler_stats();
        stats.iter().map(|s| s.map_or((0, 0), |s| (s.engine.port_errors, s.engine.port_recoveries))).collect()
    };
    assert!(a.driver.set_soft_port_state(lnd::fabric::PortState::Down));
    let mut seen = Vec::new();
    for _ in 0..1000 {
        seen = per_shard(&a);
        if seen == [(1, 0), (1, 0)] {
            break;
        }
    }
    assert_eq!(seen, [(1, 0), (1, 0)], "PORT_ERR per scheduler");
    assert_eq!(a.driver.link(), lnd::engine::LinkState::Down);
    assert!(a.driver.set_soft_port_state(lnd::fabric::PortState::Active));
    for _ in 0..1000 {
        seen = per_shard(&a);
        if seen == [(1, 1), (1, 1)] {
            break;
        }
    }
    assert_eq!(seen, [(1, 1), (1, 1)], "PORT_ACTIVE per scheduler");
    assert_eq!(a.driver.link(), lnd::engine::LinkState::Active);
}

/// The device fails under a running interface (`DEVICE_FATAL`): the connection closes, LNet's
/// next PUT fails at once with `-ENODEV`, and the NI shows its fatal error from then on.
#[test]
fn a_failed_device_fails_every_put_from_then_on() {
    let port = unique_port(0);
    let (a, b) = (Node::start("127.0.0.9", port), Node::start("127.0.0.10", port));
    let (q, qb) = (EventQueue::new(32), EventQueue::new(8));
    post(&b, 1, Arc::new(Buffer::new(1000)), MdOptions::OP_PUT, &qb);
    a.lnet.put(bind(&a, buf(&pattern(1, 1000)), 2, &q), AckReq::Ack, b.pid(), PORTAL, 1, 0, 0).unwrap();
    assert_eq!((next(&q).status, next(&q).status), (Ok(()), Ok(())));

    assert!(a.driver.inject_soft_device_fatal(), "the software fabric");
    until_engine(&a, "DEVICE_FATAL", |e| e.device_fatal == 1);
    assert_eq!(a.driver.link(), lnd::engine::LinkState::Fatal);
    assert!(a.lnet.stats().ni(a.nid).unwrap().fatal_error);
    a.lnet.put(bind(&a, buf(&pattern(2, 1000)), 2, &q), AckReq::Ack, b.pid(), PORTAL, 2, 0, 0).unwrap();
    let (send, ack) = (next(&q), next(&q));
    assert_eq!((send.kind, send.status), (EventKind::Send, Err(Errno::ENODEV)));
    assert_eq!((ack.kind, ack.status), (EventKind::Ack, Err(Errno::ENODEV)));
    let e = a.driver.stats().unwrap();
    assert_eq!(e.connections, 0, "the connection closed: {e:?}");
}

struct Expect {
    sink: Arc<Buffer>,
    data: Vec<u8>,
}

/// Issues `ops` PUTs and GETs from `me` to `peer` at once and checks every byte.
fn exchange(me: &Node, peer: &Node, seed: u64, ops: u64) {
    let mut x = seed | 1;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let q = EventQueue::new(4 * ops as usize);
    let tq = EventQueue::new(2 * ops as usize);
    let base = u64::from(me.nid.addr().octets()[3]) << 40;
    let mut expect: HashMap<u64, Expect> = HashMap::new();
    for i in 0..ops {
        let bits = base | i;
        let len = match rnd(4) {
            0 => rnd(300) as usize,
            1 => 3900 + rnd(200) as usize,
            2 => rnd(200_000) as usize,
            _ => 1 << (10 + rnd(11)),
        };
        let data = pattern(seed ^ bits, len);
        let entry = MatchEntry::new(me.pid(), bits).with_unlink(Unlink::Auto);
        let sink = Arc::new(Buffer::new(len));
        let mine = Md::contiguous(sink.clone()).with_threshold(Threshold::Count(2)).with_user_ptr(bits);
        if rnd(2) == 0 {
            let target = Md::contiguous(sink.clone())
                .with_options(MdOptions::OP_PUT)
                .with_threshold(Threshold::Count(1))
                .with_events(tq.clone());
            peer.lnet.attach(PORTAL, entry, target, Unlink::Auto).unwrap();
            let src = Md::contiguous(buf(&data)).with_threshold(Threshold::Count(2)).with_user_ptr(bits);
            let h = me.lnet.md_bind(src.with_events(q.clone()), Unlink::Auto).unwrap();
            me.lnet.put(h, AckReq::Ack, peer.pid(), PORTAL, bits, 0, 0).unwrap();
        } else {
            let source = Md::contiguous(buf(&data))
                .with_options(MdOptions::OP_GET)
                .with_threshold(Threshold::Count(1))
                .with_events(tq.clone());
            peer.lnet.attach(PORTAL, entry, source, Unlink::Auto).unwrap();
            let h = me.lnet.md_bind(mine.with_events(q.clone()), Unlink::Auto).unwrap();
            me.lnet.get(h, peer.pid(), PORTAL, bits, 0).unwrap();
        }
        expect.insert(bits, Expect { sink, data });
    }
    let mut done = 0;
    while done < ops {
        let e =
            q.wait(WAIT).unwrap_or_else(|| panic!("seed {seed:#x}: only {done}/{ops} operations finished"));
        assert_eq!(e.status, Ok(()), "seed {seed:#x}: {e:?}");
        if matches!(e.kind, EventKind::Ack | EventKind::Reply) {
            let x = &expect[&e.user_ptr];
            assert_eq!(e.mlength, x.data.len() as u64, "seed {seed:#x}: {e:?}");
            assert!(
                x.sink.to_vec(0, x.data.len()).unwrap() == x.data,
                "seed {seed:#x}: {:#x} corrupt",
                e.user_ptr
            );
            done += 1;
        }
    }
    for _ in 0..ops {
        let e = tq.wait(WAIT).unwrap_or_else(|| panic!("seed {seed:#x}: target events missing"));
        assert!(e.status.is_ok() && e.unlinked, "seed {seed:#x}: {e:?}");
    }
}

/// [`exchange`] from `a` to `b` on this thread while `b` runs one to `a` (seed `seed ^ 0xb`)
/// on another, both `ops` long.
fn exchange_both_ways(a: &Arc<Node>, b: &Arc<Node>, seed: u64, ops: u64) {
    let t = {
        let (a, b) = (a.clone(), b.clone());
        std::thread::spawn(move || exchange(&b, &a, seed ^ 0xb, ops))
    };
    exchange(a, b, seed, ops);
    if let Err(e) = t.join() {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn two_hundred_and_forty_concurrent_operations_every_byte_verified() {
    let seed = std::env::var("LNET_E2E_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x0e2e_5eed);
    let (a, b) = pair(3);
    let (a, b) = (Arc::new(a), Arc::new(b));
    exchange_both_ways(&a, &b, seed, 120);
    for n in [&a, &b] {
        // The last ACKs' own send completions may still be on their way (the peer already saw
        // them): wait, bounded, for every message to finish.
        assert!(n.lnet.wait_quiet(WAIT), "seed {seed:#x}: messages still in progress");
        let s = n.lnet.stats();
        assert_eq!((s.mds, s.messages), (0, 0), "seed {seed:#x}: {s}");
        let ni = &s.nis[0];
        assert_eq!(
            (ni.credits_available, ni.queued, ni.counters.drop_count),
            (256, 0, 0),
            "seed {seed:#x}: {s}"
        );
        println!("{s}");
    }
}

/// `fmr_cache=0` on both sides: every sink is registered for its transfer alone (and
/// deregistered when it ends) on the same-host single-copy path. PUTs and GETs both ways,
/// every byte verified, no WRITE refused. (The engine simulations in
/// `engine::tests::sink_keys` check that stale keys are refused and nothing leaks.)
#[test]
fn per_transfer_sink_registrations_carry_every_byte_on_the_same_host_path() {
    let seed = std::env::var("LNET_E2E_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xf3c0);
    let port = unique_port(0);
    let t = || Tunables { fmr_cache: false, ..Tunables::default() };
    let (a, b) = (
        Arc::new(Node::start_tuned("127.0.0.12", port, t())),
        Arc::new(Node::start_tuned("127.0.0.13", port, t())),
    );
    exchange_both_ways(&a, &b, seed, 60);
    for n in [&a, &b] {
        assert!(n.lnet.wait_quiet(WAIT), "seed {seed:#x}: messages still in progress");
        let st = n.driver.stats().unwrap();
        assert!(st.engine.sink_registrations > 0, "seed {seed:#x}: {:?}", st.engine);
        assert!(
            st.fabric.placed_writes > 0,
            "seed {seed:#x}: the single-copy path was used: {:?}",
            st.fabric
        );
        assert_eq!(st.fabric.access_errors, 0, "seed {seed:#x}");
    }
}

/// `nscheds=2`: the server's peers are spread over two scheduler threads by address, each with
/// its own engine on the one device. Eight clients and the server exchange PUTs and GETs in
/// both directions at once; every byte is verified, and each scheduler holds exactly the
/// connections of the peers that hash to it.
#[test]
fn two_schedulers_share_the_peers_of_one_interface() {
    use lnd::driver::shard::shard_of;
    let seed = std::env::var("LNET_E2E_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5ced);
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        println!("skipped: nscheds is capped at the CPUs, and this machine has one");
        return;
    }
    let port = unique_port(4);
    let server = Arc::new(Node::start_with("127.0.0.2", port, 2));
    let clients: Vec<Arc<Node>> =
        (1..=8u8).map(|i| Arc::new(Node::start_with(&format!("127.0.30.{i}"), port, 1))).collect();
    let mut per_shard = [0usize; 2];
    for c in &clients {
        per_shard[shard_of(c.nid.addr(), 2)] += 1;
    }
    assert!(per_shard.iter().all(|&n| n > 0), "the test's addresses must reach both shards: {per_shard:?}");
    let mut threads = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let k = seed ^ (i as u64) << 8;
        let (c1, s1) = (c.clone(), server.clone());
        threads.push(std::thread::spawn(move || exchange(&c1, &s1, k, 24)));
        let (c2, s2) = (c.clone(), server.clone());
        threads.push(std::thread::spawn(move || exchange(&s2, &c2, k ^ 0x5, 24)));
    }
    for t in threads {
        if let Err(e) = t.join() {
            std::panic::resume_unwind(e);
        }
    }
    let stats = server.driver.scheduler_stats();
    assert_eq!(stats.len(), 2);
    let conns: Vec<usize> = stats.iter().map(|s| s.expect("the scheduler answers").connections).collect();
    assert_eq!(conns, per_shard, "seed {seed:#x}: connections per scheduler");
    let total = server.driver.stats().unwrap();
    assert_eq!(total.connections, 8);
    assert_eq!(total.engine.conns_established, 8, "seed {seed:#x}: one connection per client: {total:?}");
    println!(
        "two schedulers: connections per scheduler {conns:?}, {} messages received",
        total.engine.rx_msgs
    );
}

/// Completion-channel notifications on both nodes' devices so far.
fn notifications(a: &Node, b: &Node) -> u64 {
    [a, b].iter().map(|n| n.driver.stats().expect("the scheduler answers").fabric.cq_notifications).sum()
}

/// Sends `count` PUTs with ACK from `a` to `b`, one at a time, each waited for.
fn ping_pong(a: &Node, b: &Node, bits: u64, count: usize) {
    let (qa, qb) = (EventQueue::new(8), EventQueue::new(8));
    let md = Md::contiguous(Arc::new(Buffer::new(64)))
        .with_options(MdOptions::OP_PUT | MdOptions::MANAGE_REMOTE)
        .with_threshold(Threshold::Infinite)
        .with_events(qb.clone());
    b.lnet.attach(PORTAL, MatchEntry::new(ANY_PROCESS, bits), md, Unlink::Retain).unwrap();
    for i in 0..count {
        let h = bind(a, buf(&pattern(i as u64, 64)), 2, &qa);
        a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, bits, 0, 0).unwrap();
        assert_eq!(next(&qb).kind, EventKind::Put);
        let (send, ack) = (next(&qa), next(&qa));
        assert_eq!(
            (send.kind, send.status, ack.kind, ack.status),
            (EventKind::Send, Ok(()), EventKind::Ack, Ok(()))
        );
    }
}

/// `busy_poll_usec` and the CQs: a scheduler that never spins takes every completion through
/// an armed CQ's notification; one that spins polls its busy CQs unarmed and takes almost
/// none; and one whose spin ran out armed its CQs before sleeping, so the next message after
/// a quiet spell comes through a notification (which is what wakes a sleeping scheduler).
#[test]
fn busy_polled_cqs_take_no_notifications_and_are_armed_before_sleeping() {
    const N: usize = 200;
    let start = |offset: u16, busy_poll_usec: u32| {
        let port = unique_port(offset);
        let t = || Tunables { busy_poll_usec, ..Tunables::default() };
        (Node::start_tuned("127.0.0.1", port, t()), Node::start_tuned("127.0.0.2", port, t()))
    };
    let (a, b) = start(5, 0);
    ping_pong(&a, &b, 1, 1);
    let before = notifications(&a, &b);
    ping_pong(&a, &b, 2, N);
    let never_spinning = notifications(&a, &b) - before;
    drop((a, b));

    let (a, b) = start(6, 20_000);
    ping_pong(&a, &b, 1, 1);
    let before = notifications(&a, &b);
    ping_pong(&a, &b, 2, N);
    let spinning = notifications(&a, &b) - before;
    println!("{N} PUTs with ACK: {never_spinning} CQ notifications never spinning, {spinning} spinning");
    assert!(never_spinning >= N as u64, "{never_spinning} notifications for {N} PUTs without spinning");
    assert!(spinning * 10 < never_spinning, "spinning: {spinning}, never spinning: {never_spinning}");
    for round in 0..3 {
        // Idle for longer than the 20 ms spin, then one more exchange.
        #[allow(
            clippy::disallowed_methods,
            reason = "idle time is this test's input (the schedulers are to go to sleep), not a wait for a condition"
        )]
        std::thread::sleep(Duration::from_millis(100));
        let before = notifications(&a, &b);
        ping_pong(&a, &b, 3 + round, 1);
        assert!(notifications(&a, &b) > before, "round {round}: no CQ was armed when the schedulers slept");
    }
}
