//! Lazy portals ([`super::lazy`]): PUTs that match nothing wait for an MD, in order, within
//! the byte limit; clearing and shutdown drop them.
//!
//! Most tests drive LNet's upcalls by hand through an LND that keeps what LNet sends (ACKs),
//! so each step is deterministic; the last runs two LNets over the loopback LND.

use std::sync::{Arc, Mutex};

use super::tests::{PORTAL, ShutdownHookLnd, WAIT, buf, next, no_more, node, pattern};
use super::*;
use crate::buffer::Buffer;
use crate::event::{EventKind, EventQueue};
use crate::hdr::{GetMsg, LnetMsg, PutMsg};
use crate::lnd::{RecvDisposition, copy_to_frags};
use crate::loopback::LoopbackNet;
use crate::matching::{ANY_PROCESS, MdOptions, Threshold};

/// One LNet whose LND keeps every send, with the NI's upcalls to play its peer.
struct Target {
    lnet: Lnet,
    up: Arc<dyn LndUpcalls>,
    lnd: Arc<ShutdownHookLnd>,
    me: ProcessId,
    peer: ProcessId,
}

fn target(lazy_max_bytes: u64) -> Target {
    let nid: Nid = "10.0.40.1@o2ib".parse().unwrap();
    let lnd = Arc::new(ShutdownHookLnd { nid, sent: Mutex::new(Vec::new()), on_shutdown: Mutex::new(None) });
    let lnet = Lnet::new(LnetConfig { lazy_max_bytes, ..LnetConfig::default() }).unwrap();
    let mut up = None;
    lnet.add_ni(nid, 8, 8, |u| {
        up = Some(u);
        Ok::<_, std::io::Error>(lnd.clone() as Arc<dyn Lnd>)
    })
    .unwrap();
    lnet.set_lazy_portal(PORTAL).unwrap();
    let peer = ProcessId::new("10.0.40.2@o2ib".parse().unwrap(), ProcessId::PID_LUSTRE);
    Target { lnet, up: up.unwrap(), lnd, me: ProcessId::new(nid, ProcessId::PID_LUSTRE), peer }
}

impl Target {
    fn put_hdr(&self, bits: u64, len: usize, ack: bool) -> LnetHdr {
        LnetHdr {
            dest: self.me,
            src: self.peer,
            payload_length: len as u32,
            msg: LnetMsg::Put(PutMsg {
                ack_wmd: if ack { WireHandle::new(7, bits) } else { WireHandle::NONE },
                match_bits: bits,
                hdr_data: bits,
                ptl_index: PORTAL,
                offset: 0,
            }),
        }
    }

    /// An IMMEDIATE PUT of `data` with match bits `bits`.
    fn immediate(&self, bits: u64, data: &[u8], ack: bool) {
        self.up.recv_immediate(self.peer.nid, &self.put_hdr(bits, data.len(), ack), data);
    }

    /// An RDMA PUT of `len` bytes: LNet's answer (the data not moved yet).
    fn rdma(&self, bits: u64, len: usize, ack: bool) -> RecvDisposition {
        self.up.recv(self.peer.nid, &self.put_hdr(bits, len, ack), true)
    }

    /// Moves `data` into an RDMA PUT's sink and reports it, as the LND does.
    fn rdma_done(&self, disposition: RecvDisposition, data: &[u8]) {
        let RecvDisposition::Sink { frags, mlength, token } = disposition else {
            panic!("a sink for the PUT, not {disposition:?}")
        };
        assert_eq!(mlength, data.len());
        self.up.recv_done(token, Ok(copy_to_frags(&frags, data).unwrap()));
    }

    /// An MD of `len` bytes for match bits `bits` on the lazy portal.
    fn post(&self, bits: u64, len: usize, md: impl FnOnce(Md) -> Md, q: &EventQueue) -> Arc<Buffer> {
        let sink = Arc::new(Buffer::new(len));
        let m = md(Md::contiguous(sink.clone()).with_options(MdOptions::OP_PUT).with_events(q.clone()));
        self.lnet.attach(PORTAL, MatchEntry::new(ANY_PROCESS, bits), m, Unlink::Retain).unwrap();
        sink
    }

    /// The ACKs LNet has sent so far: (match bits, mlength).
    fn acks(&self) -> Vec<(u64, u32)> {
        let sent = self.lnd.sent.lock().unwrap();
        sent.iter()
            .filter_map(|m| match m.hdr.msg {
                LnetMsg::Ack(a) => Some((a.match_bits, a.mlength)),
                _ => None,
            })
            .collect()
    }

    fn stats(&self) -> (LazyStats, DropCounts) {
        let s = self.lnet.stats();
        (s.lazy, s.nis[0].drops)
    }
}

#[test]
fn a_put_that_matches_nothing_on_a_lazy_portal_waits_for_an_md() {
    let t = target(DEFAULT_LAZY_MAX_BYTES);
    let q = EventQueue::new(16);
    let (small, large) = (pattern(1, 100), pattern(2, 50_000));
    t.immediate(1, &small, true);
    let rdma = t.rdma(2, large.len(), true);
    t.rdma_done(rdma, &large);
    // A GET that matches nothing is not kept, lazy portal or not.
    let get = LnetHdr {
        dest: t.me,
        src: t.peer,
        payload_length: 0,
        msg: LnetMsg::Get(GetMsg {
            return_wmd: WireHandle::new(7, 3),
            match_bits: 3,
            ptl_index: PORTAL,
            src_offset: 0,
            sink_length: 10,
        }),
    };
    assert!(matches!(t.up.recv(t.peer.nid, &get, true), RecvDisposition::Drop));
    let (lazy, drops) = t.stats();
    assert_eq!((lazy.portals, lazy.waiting, lazy.waiting_bytes), (1, 2, 50_100));
    assert_eq!((lazy.delayed, lazy.resumed, drops.no_match), (2, 0, 1));
    assert!(t.acks().is_empty(), "no ACK before the PUTs match");
    assert_eq!(t.lnet.stats().messages, 0, "a waiting PUT is not a message in progress");

    // The RDMA PUT's MD comes first: it matches that one only.
    let sink2 = t.post(2, 60_000, |m| m, &q);
    let e = next(&q);
    assert_eq!(
        (e.kind, e.status, e.match_bits, e.mlength, e.rlength),
        (EventKind::Put, Ok(()), 2, 50_000, 50_000)
    );
    assert_eq!((e.initiator, e.hdr_data), (t.peer, 2));
    assert_eq!(sink2.to_vec(0, large.len()).unwrap(), large);
    assert_eq!(t.acks(), vec![(2, 50_000)]);
    no_more(&q);
    let sink1 = t.post(1, 100, |m| m, &q);
    let e = next(&q);
    assert_eq!((e.kind, e.status, e.match_bits, e.mlength), (EventKind::Put, Ok(()), 1, 100));
    assert_eq!(sink1.to_vec(0, 100).unwrap(), small);
    assert_eq!(t.acks(), vec![(2, 50_000), (1, 100)]);
    let (lazy, _) = t.stats();
    assert_eq!((lazy.waiting, lazy.waiting_bytes, lazy.delayed, lazy.resumed), (0, 0, 2, 2));
    let s = t.lnet.stats();
    assert_eq!((s.nis[0].counters.recv_count, s.nis[0].counters.recv_bytes), (2, 50_100));
    // With an MD there, a PUT matches on arrival as on any portal.
    let sink9 = t.post(9, 100, |m| m, &q);
    t.immediate(9, &small, false);
    assert_eq!((next(&q).match_bits, t.stats().0.delayed), (9, 2));
    assert_eq!(sink9.to_vec(0, 100).unwrap(), small);
}

#[test]
fn waiting_puts_match_in_the_order_they_arrived() {
    let t = target(DEFAULT_LAZY_MAX_BYTES);
    let q = EventQueue::new(16);
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(10 + i, 1000)).collect();
    for d in &data {
        t.immediate(5, d, false);
    }
    // An MD for two of them: the first two, at offsets 0 and 1000.
    let sink = t.post(5, 2000, |m| m.with_threshold(Threshold::Count(2)), &q);
    let (e1, e2) = (next(&q), next(&q));
    assert_eq!((e1.offset, e2.offset, e2.unlinked), (0, 1000, false));
    assert_eq!(sink.to_vec(0, 2000).unwrap(), [data[0].clone(), data[1].clone()].concat());
    assert_eq!(t.stats().0.waiting, 1);
    let sink = t.post(5, 1000, |m| m, &q);
    assert_eq!(next(&q).offset, 0);
    assert_eq!(sink.to_vec(0, 1000).unwrap(), data[2]);
    assert_eq!(t.stats().0.waiting, 0);
}

#[test]
fn a_lazy_portal_keeps_no_more_than_the_byte_limit() {
    let t = target(1000);
    t.immediate(1, &[1; 600], true);
    // This one would pass the limit: dropped, with the drop NAK for its ACK.
    t.immediate(2, &[2; 600], true);
    assert_eq!(t.acks(), vec![(2, DROP_NAK_MLENGTH)]);
    // An RDMA PUT past it is refused (the LND answers PUT_NAK).
    assert!(matches!(t.rdma(3, 401, true), RecvDisposition::Drop));
    // One that fits exactly is kept.
    let d = t.rdma(4, 400, false);
    t.rdma_done(d, &[4; 400]);
    let (lazy, drops) = t.stats();
    assert_eq!((lazy.waiting, lazy.waiting_bytes, drops.lazy_full, drops.no_match), (2, 1000, 2, 0));
    // Nothing is kept with a limit of 0.
    let t = target(0);
    t.immediate(1, &[1; 1], false);
    let (lazy, drops) = t.stats();
    assert_eq!((lazy.waiting, drops.lazy_full), (0, 1));
}

#[test]
fn a_waiting_put_too_long_for_the_md_it_matches_is_dropped() {
    let t = target(DEFAULT_LAZY_MAX_BYTES);
    let q = EventQueue::new(16);
    t.immediate(1, &pattern(3, 200), true);
    t.immediate(2, &pattern(4, 200), true);
    t.post(1, 100, |m| m, &q);
    no_more(&q);
    assert_eq!(t.acks(), vec![(1, DROP_NAK_MLENGTH)]);
    assert_eq!(t.stats().1.too_long, 1);
    // With TRUNCATE the MD takes what fits.
    let sink = t.post(2, 100, |m| m.with_options(MdOptions::OP_PUT | MdOptions::TRUNCATE), &q);
    let e = next(&q);
    assert_eq!((e.status, e.mlength, e.rlength), (Ok(()), 100, 200));
    assert_eq!(sink.to_vec(0, 100).unwrap(), pattern(4, 200)[..100]);
    assert_eq!(t.acks(), vec![(1, DROP_NAK_MLENGTH), (2, 100)]);
}

#[test]
fn clearing_a_lazy_portal_drops_what_waits_there() {
    let t = target(DEFAULT_LAZY_MAX_BYTES);
    let q = EventQueue::new(16);
    t.immediate(1, &[1; 10], true);
    t.immediate(2, &[2; 10], false);
    // An RDMA PUT whose data is still moving when the portal is cleared.
    let moving = t.rdma(3, 5000, true);
    t.lnet.clear_lazy_portal(PORTAL).unwrap();
    assert_eq!(t.acks(), vec![(1, DROP_NAK_MLENGTH)]);
    let (lazy, drops) = t.stats();
    assert_eq!((lazy.portals, lazy.waiting, drops.lazy_discarded), (0, 1, 2));
    t.rdma_done(moving, &[3; 5000]);
    assert_eq!(t.acks(), vec![(1, DROP_NAK_MLENGTH), (3, DROP_NAK_MLENGTH)]);
    let (lazy, drops) = t.stats();
    assert_eq!((lazy.waiting, lazy.waiting_bytes, drops.lazy_discarded), (0, 0, 3));
    // Not lazy any more: a PUT that matches nothing is dropped at once, and a later MD gets
    // nothing.
    t.immediate(4, &[4; 10], false);
    t.post(1, 100, |m| m, &q);
    t.post(4, 100, |m| m, &q);
    no_more(&q);
    assert_eq!(t.stats().1.no_match, 1);
    // Clearing a portal that is not lazy is a no-op; a bad portal is refused either way.
    t.lnet.clear_lazy_portal(PORTAL).unwrap();
    assert!(matches!(
        t.lnet.set_lazy_portal(DEFAULT_PORTALS as u32),
        Err(LnetError::Match(MatchError::BadPortal { .. }))
    ));
    assert!(matches!(
        t.lnet.clear_lazy_portal(u32::MAX),
        Err(LnetError::Match(MatchError::BadPortal { .. }))
    ));
}

#[test]
fn an_rdma_put_whose_data_fails_to_arrive_leaves_nothing_waiting() {
    let t = target(DEFAULT_LAZY_MAX_BYTES);
    let RecvDisposition::Sink { token, .. } = t.rdma(1, 3000, true) else { panic!("a sink") };
    assert_eq!(t.stats().0.waiting, 1);
    t.up.recv_done(token, Err(LndError::new(Errno::ECONNABORTED, Health::RemoteDropped)));
    let (lazy, _) = t.stats();
    assert_eq!((lazy.waiting, lazy.waiting_bytes), (0, 0));
    assert_eq!(t.lnet.stats().nis[0].counters.recv_errors, 1);
    // Its MD, posted later, stays untouched.
    let q = EventQueue::new(4);
    t.post(1, 3000, |m| m, &q);
    no_more(&q);
    assert!(t.acks().is_empty());
}

#[test]
fn shutdown_drops_the_waiting_puts() {
    let t = target(DEFAULT_LAZY_MAX_BYTES);
    t.immediate(1, &[1; 10], false);
    let _moving = t.rdma(2, 5000, false);
    t.lnet.shutdown();
    let (lazy, drops) = t.stats();
    assert_eq!((lazy.waiting, lazy.waiting_bytes, drops.lazy_discarded), (0, 0, 1));
    // The one still moving ended with the LND's shutdown error.
    assert_eq!(t.lnet.stats().nis[0].counters.recv_errors, 1);
    assert!(matches!(t.lnet.set_lazy_portal(PORTAL), Err(LnetError::ShutDown)));
}

#[test]
fn an_rdma_put_whose_data_lands_during_shutdown_is_dropped_without_an_ack() {
    let t = target(DEFAULT_LAZY_MAX_BYTES);
    t.immediate(1, &[1; 10], true);
    let moving = t.rdma(2, 5000, true);
    let up = t.up.clone();
    *t.lnd.on_shutdown.lock().unwrap() = Some(Box::new(move || {
        let RecvDisposition::Sink { frags, token, .. } = moving else { panic!("a sink") };
        up.recv_done(token, Ok(copy_to_frags(&frags, &[2; 5000]).unwrap()));
    }));
    t.lnet.shutdown();
    let (lazy, drops) = t.stats();
    assert_eq!((lazy.waiting, lazy.waiting_bytes, drops.lazy_discarded), (0, 0, 2));
    // No drop NAK is sent once LNet is going down; nothing failed either.
    assert!(t.acks().is_empty());
    assert_eq!(t.lnet.stats().nis[0].counters.recv_errors, 0);
}

/// Two LNets over the loopback LND: PUTs (IMMEDIATE and RDMA) sent before the target posts
/// anything complete with their ACKs once it does, with every byte in place.
#[test]
fn over_the_loopback_lnd_puts_sent_before_any_md_is_posted_are_delivered() {
    let net = LoopbackNet::new();
    let (a, b) = (node(&net, "10.0.41.1"), node(&net, "10.0.41.2"));
    b.lnet.set_lazy_portal(PORTAL).unwrap();
    let (qa, qb) = (EventQueue::new(64), EventQueue::new(64));
    let lens = [100usize, 3976, 3977, 1 << 20];
    for (i, len) in lens.into_iter().enumerate() {
        let md = Md::contiguous(buf(&pattern(i as u64, len)))
            .with_threshold(Threshold::Count(2))
            .with_events(qa.clone());
        let h = a.lnet.md_bind(md, Unlink::Auto).unwrap();
        a.lnet.put(h, AckReq::Ack, b.pid(), PORTAL, 0x500 + i as u64, 0, 0).unwrap();
        // The loopback LND delivers at the target before it reports the send.
        let e = next(&qa);
        assert_eq!((e.kind, e.status), (EventKind::Send, Ok(())));
    }
    no_more(&qa);
    assert_eq!(b.lnet.stats().lazy.waiting, lens.len());
    let sinks: Vec<Arc<Buffer>> = lens
        .iter()
        .enumerate()
        .rev()
        .map(|(i, &len)| {
            let sink = Arc::new(Buffer::new(len));
            let md = Md::contiguous(sink.clone()).with_options(MdOptions::OP_PUT).with_events(qb.clone());
            b.lnet
                .attach(PORTAL, MatchEntry::new(ANY_PROCESS, 0x500 + i as u64), md, Unlink::Retain)
                .unwrap();
            sink
        })
        .collect();
    for (sink, (i, &len)) in sinks.iter().zip(lens.iter().enumerate().rev()) {
        let e = next(&qb);
        assert_eq!(
            (e.kind, e.status, e.mlength, e.match_bits),
            (EventKind::Put, Ok(()), len as u64, 0x500 + i as u64)
        );
        assert_eq!(sink.to_vec(0, len).unwrap(), pattern(i as u64, len));
    }
    for _ in lens {
        let e = qa.wait(WAIT).expect("an ACK");
        assert_eq!((e.kind, e.status), (EventKind::Ack, Ok(())));
    }
    let s = b.lnet.stats();
    assert_eq!((s.lazy.waiting, s.lazy.delayed, s.lazy.resumed), (0, 4, 4));
    assert_eq!(s.nis[0].drops.total(), 0);
}
