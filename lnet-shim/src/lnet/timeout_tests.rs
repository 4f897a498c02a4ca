//! Response timeouts (`lnet/timeout.rs`) over the loopback LND: sweeps made by hand, then the
//! monitor thread on a short timeout.

use std::sync::Arc;
use std::time::Duration;

use super::tests::{PORTAL, WAIT, bind_for_one_op, buf, events, next, no_more, node, post};
use super::*;
use crate::event::{EventKind, EventQueue};
use crate::loopback::{LoopbackConfig, LoopbackNet};
use crate::matching::MdOptions;

/// A PUT whose target never acknowledges (`ACK_DISABLE`): its ACK is given up on the third
/// sweep, not before, with `-ETIMEDOUT`, and the MD goes (an UNLINK event; its handle is
/// stale); the count is in the stats.
#[test]
fn an_ack_that_never_comes_times_out_on_the_third_sweep() {
    let net = LoopbackNet::new();
    let (a, b) = (node(&net, "10.0.0.1"), node(&net, "10.0.0.2"));
    let (qa, qb) = (EventQueue::new(16), EventQueue::new(16));
    post(&b, 9, 10, MdOptions::OP_PUT | MdOptions::ACK_DISABLE, &qb);
    let h = source(&a.lnet, 4, &qa);
    a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 9, 0, 0).unwrap();
    assert_eq!(next(&qa).kind, EventKind::Send);
    assert_eq!(next(&qb).kind, EventKind::Put);
    for sweep in 1..EXPIRE_SWEEPS {
        assert_eq!(a.lnet.sweep_responses(), 0, "sweep {sweep}");
        no_more(&qa);
    }
    assert_eq!(a.lnet.sweep_responses(), 1);
    let ev = events(&qa, 2);
    assert_eq!((ev[0].kind, ev[0].status, ev[0].md_handle), (EventKind::Ack, Err(Errno::ETIMEDOUT), h));
    assert_eq!((ev[1].kind, ev[1].status, ev[1].unlinked), (EventKind::Unlink, Ok(()), true));
    no_more(&qa);
    assert!(matches!(a.lnet.md_unlink(h), Err(LnetError::StaleMd)));
    assert_eq!(a.lnet.stats().response_timeouts, 1);
    // Nothing is left to sweep.
    assert_eq!(a.lnet.sweep_responses(), 0);
    assert_eq!(a.lnet.stats().mds, 0);
}

/// A REPLY held up at the target past the timeout: the GET's REPLY event says `-ETIMEDOUT`,
/// and the REPLY that arrives afterwards finds no MD, is dropped and counted as unexpected,
/// the sink untouched.
#[test]
fn a_late_reply_is_dropped_after_its_get_timed_out() {
    // Header-only GETs: the target's LNet answers with a REPLY message, which its paused LND
    // holds.
    let net = LoopbackNet::with_config(LoopbackConfig { header_only_gets: true, ..Default::default() });
    let (a, b) = (node(&net, "10.0.0.1"), node(&net, "10.0.0.2"));
    let (qa, qb) = (EventQueue::new(16), EventQueue::new(16));
    let (src, _) = post(&b, 3, 64, MdOptions::OP_GET, &qb);
    src.write(0, &[7; 64]).unwrap();
    let sink = Arc::new(crate::buffer::Buffer::new(64));
    let h = bind_for_one_op(&a, sink.clone(), &qa);
    b.lnd.pause();
    a.lnet.get(h, b.pid(), PORTAL, 3, 0).unwrap();
    assert_eq!(next(&qa).kind, EventKind::Send);
    for _ in 0..EXPIRE_SWEEPS {
        a.lnet.sweep_responses();
    }
    let r = next(&qa);
    assert_eq!((r.kind, r.status), (EventKind::Reply, Err(Errno::ETIMEDOUT)));
    assert_eq!(next(&qa).kind, EventKind::Unlink);
    b.lnd.resume();
    // The target's GET event comes once its REPLY is sent.
    assert_eq!(next(&qb).kind, EventKind::Get);
    // The REPLY went out when b resumed; the loopback delivers in order, so a PUT behind it
    // proves a has handled it.
    let (_, _) = post(&b, 4, 10, MdOptions::OP_PUT, &qb);
    let probe = source(&a.lnet, 1, &qa);
    a.lnet.put(probe, AckReq::Ack, b.pid(), PORTAL, 4, 0, 0).unwrap();
    let ev = events(&qa, 2);
    assert!(ev.iter().any(|e| (e.kind, e.status) == (EventKind::Ack, Ok(()))), "{ev:?}");
    assert_eq!(next(&qb).kind, EventKind::Put);
    assert_eq!(a.lnet.stats().nis[0].drops.unexpected, 1);
    assert!(sink.to_vec(0, 64).unwrap().iter().all(|&x| x == 0), "a late REPLY wrote the sink");
}

/// A response whose operation is still being sent when it times out: nothing until the SEND
/// ends (the LND may still be reading the payload), then the SEND, then the timed-out ACK as
/// the MD's last event (`unlinked`, no UNLINK event).
#[test]
fn a_timeout_while_the_send_is_in_flight_waits_for_the_send_event() {
    let net = LoopbackNet::new();
    let (a, b) = (node(&net, "10.0.0.1"), node(&net, "10.0.0.2"));
    let (qa, qb) = (EventQueue::new(16), EventQueue::new(16));
    post(&b, 5, 10, MdOptions::OP_PUT | MdOptions::ACK_DISABLE, &qb);
    a.lnd.pause();
    let h = source(&a.lnet, 2, &qa);
    a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 5, 0, 0).unwrap();
    for _ in 0..EXPIRE_SWEEPS {
        a.lnet.sweep_responses();
    }
    no_more(&qa);
    a.lnd.resume();
    let s = next(&qa);
    assert_eq!((s.kind, s.status, s.unlinked), (EventKind::Send, Ok(()), false));
    let t = next(&qa);
    assert_eq!((t.kind, t.status, t.unlinked), (EventKind::Ack, Err(Errno::ETIMEDOUT), true));
    no_more(&qa);
    assert_eq!(next(&qb).kind, EventKind::Put);
}

/// Responses that come in time are not touched by sweeps, however many; an MD with several
/// operations is expired by its oldest outstanding response, ending every response it waits
/// for; a sweep after shutdown has nothing to do.
#[test]
fn sweeps_spare_answered_operations_and_expire_whole_mds() {
    let net = LoopbackNet::new();
    let (a, b) = (node(&net, "10.0.0.1"), node(&net, "10.0.0.2"));
    let (qa, qb) = (EventQueue::new(64), EventQueue::new(64));
    post(&b, 1, 10, MdOptions::OP_PUT, &qb);
    // One PUT each (`post`'s MDs take one operation).
    post(&b, 2, 10, MdOptions::OP_PUT | MdOptions::ACK_DISABLE, &qb);
    post(&b, 3, 10, MdOptions::OP_PUT | MdOptions::ACK_DISABLE, &qb);
    let h = source(&a.lnet, 3, &qa);
    // Answered: two sweeps before the ACK comes are no harm.
    a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 1, 0, 0).unwrap();
    a.lnet.sweep_responses();
    a.lnet.sweep_responses();
    let ev = events(&qa, 2);
    assert!(ev.iter().any(|e| (e.kind, e.status) == (EventKind::Ack, Ok(()))), "{ev:?}");
    assert_eq!(next(&qb).kind, EventKind::Put);
    // Two silent operations on the same MD, one sweep apart: the older one's third sweep
    // ends both.
    a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 2, 0, 0).unwrap();
    assert_eq!(next(&qa).kind, EventKind::Send);
    assert_eq!(a.lnet.sweep_responses(), 0);
    a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 3, 0, 0).unwrap();
    assert_eq!(next(&qa).kind, EventKind::Send);
    // Both PUTs landed (the target's events): nothing is on its way back.
    assert_eq!((next(&qb).kind, next(&qb).kind), (EventKind::Put, EventKind::Put));
    assert_eq!(a.lnet.sweep_responses(), 0);
    assert_eq!(a.lnet.sweep_responses(), 2);
    let ev: Vec<Event> = (0..3).map(|_| next(&qa)).collect();
    let timed_out =
        ev.iter().filter(|e| e.kind == EventKind::Ack && e.status == Err(Errno::ETIMEDOUT)).count();
    assert_eq!((timed_out, ev[2].kind), (2, EventKind::Unlink), "{ev:?}");
    assert_eq!(a.lnet.stats().response_timeouts, 2);
    // Shutdown ends what waits with -ESHUTDOWN; sweeps do nothing after it.
    post(&b, 11, 10, MdOptions::OP_PUT | MdOptions::ACK_DISABLE, &qb);
    let h2 = source(&a.lnet, 3, &qa);
    a.lnet.put(h2, AckReq::Ack, b.pid(), PORTAL, 11, 0, 0).unwrap();
    assert_eq!(next(&qa).kind, EventKind::Send);
    a.lnet.shutdown();
    let e = next(&qa);
    assert_eq!((e.kind, e.status), (EventKind::Ack, Err(Errno::ESHUTDOWN)));
    assert_eq!(a.lnet.sweep_responses(), 0);
    no_more(&qa);
}

/// The configuration: a zero timeout is refused; `None` starts no monitor and never times
/// out (by hand, sweeps still count, so the test can look).
#[test]
fn a_zero_timeout_is_refused() {
    let config = LnetConfig { transaction_timeout: Some(Duration::ZERO), ..LnetConfig::default() };
    assert!(matches!(Lnet::new(config), Err(LnetError::BadTransactionTimeout)));
    assert_eq!(LnetConfig::default().transaction_timeout, Some(Duration::from_secs(150)));
    let off = Lnet::new(LnetConfig { transaction_timeout: None, ..LnetConfig::default() }).unwrap();
    assert!(off.inner.monitor.get().is_none());
}

/// The monitor thread on a short timeout gives up a silent ACK by itself, delivering the
/// events from its own thread; the LNet then shuts down with the thread joined.
#[test]
fn the_monitor_thread_times_out_a_silent_ack() {
    let net = LoopbackNet::new();
    let b = node(&net, "10.0.0.2");
    let config =
        LnetConfig { transaction_timeout: Some(Duration::from_millis(100)), ..LnetConfig::default() };
    let a_nid: Nid = "10.0.0.1@o2ib".parse().unwrap();
    let lnet = Lnet::new(config).unwrap();
    lnet.add_ni(a_nid, 256, 8, |up| net.start(a_nid, up).map(|l| l as Arc<dyn Lnd>)).unwrap();
    let (qa, qb) = (EventQueue::new(16), EventQueue::new(16));
    post(&b, 9, 10, MdOptions::OP_PUT | MdOptions::ACK_DISABLE, &qb);
    let h = source(&lnet, 4, &qa);
    lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 9, 0, 0).unwrap();
    assert_eq!(next(&qa).kind, EventKind::Send);
    let ack = qa.wait(WAIT).expect("the monitor gives the ACK up within the wait");
    assert_eq!((ack.kind, ack.status), (EventKind::Ack, Err(Errno::ETIMEDOUT)));
    if !ack.unlinked {
        // The usual case; on a loaded machine the SEND may still have been in flight at the
        // timeout, and then the ACK is the MD's last event.
        assert_eq!(next(&qa).kind, EventKind::Unlink);
    }
    assert_eq!(lnet.stats().response_timeouts, 1);
    lnet.shutdown();
    assert!(lnet.inner.monitor.get().is_some_and(|m| m.is_stopped()));
}

const EXPIRE_SWEEPS: u8 = super::timeout::EXPIRE_AFTER_SWEEPS;

/// A 10-byte source filled with `fill`, bound for any number of operations (kept), its events
/// to `q`.
fn source(lnet: &Lnet, fill: u8, q: &EventQueue) -> MdHandle {
    lnet.md_bind(Md::contiguous(buf(&[fill; 10])).with_events(q.clone()), Unlink::Retain).unwrap()
}
