//! Two [`Cm`]s joined by an in-test MAD channel on a virtual clock, with optional seeded loss,
//! duplication and reordering.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::*;
use crate::cm::ip_cm::{PortSpace, ip_service_id};
use crate::cm::mad::{Dreq, MessageMraed, MessageRejected, Mra, Req, RoceReqParams, TransportType, cm_tid};

const A: usize = 0;
const B: usize = 1;
const A_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 2);
const A_GUID: u64 = 0x0200_5eff_fe00_0001;
const B_GUID: u64 = 0x0200_5eff_fe00_0002;
const SID: u64 = ip_service_id(PortSpace::Tcp, 987);
const A_QPN: u32 = 0x111;
const B_QPN: u32 = 0x222;
const A_PSN: u32 = 0xAB_CDEF;
const B_PSN: u32 = 0x12_3456;
/// REQ timer of [`config`]: 2·2^(10−8) + 2^(12−8) ms.
const REQ_TIMEOUT: Duration = Duration::from_millis(24);
/// REP timer of [`config`]: 2^(12−8) ms.
const REP_TIMEOUT: Duration = Duration::from_millis(16);
const TIMEWAIT: Duration = Duration::from_millis(100);
const RETRIES: u32 = 15;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(d: Duration) -> Instant {
    Instant::ZERO + d
}

fn ip(side: usize) -> Ipv4Addr {
    if side == A { A_IP } else { B_IP }
}

fn addr(side: usize) -> PortAddr {
    PortAddr::from_ipv4(ip(side))
}

fn config(side: usize) -> CmConfig {
    let guid = if side == A { A_GUID } else { B_GUID };
    CmConfig {
        cm_response_timeout: 12,
        packet_life_time: 10,
        timewait: TIMEWAIT,
        ..CmConfig::roce(addr(side), ip(side), guid)
    }
}

fn consumer_pd() -> [u8; 56] {
    let mut pd = [0u8; 56];
    for (i, b) in pd.iter_mut().enumerate() {
        *b = 0xC0 ^ i as u8;
    }
    pd
}

fn params() -> ConnectParams {
    ConnectParams {
        dest: addr(B),
        dest_ip: B_IP,
        src_port: 1023,
        service_id: SID,
        qpn: A_QPN,
        start_psn: A_PSN,
        path_mtu: Mtu::Mtu1024,
        retry_count: 5,
        rnr_retry_count: 6,
        responder_resources: 1,
        initiator_depth: 2,
        local_ack_timeout: 17,
        private_data: consumer_pd(),
    }
}

fn decode(mad: &Mad) -> CmMessage {
    CmMad::decode(mad).unwrap_or_else(|e| panic!("a Cm emitted an undecodable MAD: {e}")).msg
}

fn tid(mad: &Mad) -> u64 {
    CmMad::decode(mad).unwrap().tid
}

/// A REQ from a fictitious requester, for flood and fuzz tests.
fn req_mad(comm_id: u32, qpn: u32, guid: u64) -> Mad {
    let cma = CmaHeader { src_port: 1023, src: A_IP, dst: B_IP };
    let private_data = req_private_data(&cma, &[0u8; 56]).unwrap();
    let req = Req::roce_defaults(RoceReqParams {
        local_comm_id: comm_id,
        service_id: SID,
        local_ca_guid: guid,
        local_qpn: qpn,
        starting_psn: 1,
        local_ip: A_IP,
        remote_ip: B_IP,
        path_mtu: Mtu::Mtu1024,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: true,
        retry_count: 5,
        rnr_retry_count: 6,
        private_data,
    });
    CmMad::new(cm_tid(7, comm_id), CmMessage::Req(req)).encode().unwrap()
}

type Keep = Box<dyn FnMut(usize, &CmMessage) -> bool>;

/// Drops the first `n` messages named `kind` sent by `sender`.
fn drop_first(sender: usize, kind: &'static str, n: usize) -> Keep {
    let mut seen = 0;
    Box::new(move |s, m| {
        if s == sender && m.name() == kind && seen < n {
            seen += 1;
            false
        } else {
            true
        }
    })
}

/// Drops every message named `kind` sent by `sender`.
fn drop_all(sender: usize, kind: &'static str) -> Keep {
    Box::new(move |s, m| !(s == sender && m.name() == kind))
}

struct Net {
    now: Instant,
    cms: [Cm; 2],
    events: [Vec<(Instant, CmEvent)>; 2],
    /// Every MAD a `Cm` emitted: (time, sender, bytes).
    wire: Vec<(Instant, usize, Mad)>,
    inflight: VecDeque<(usize, Mad)>,
    rng: Rng,
    loss: f64,
    dup: f64,
    reorder: f64,
    keep: Keep,
    auto_accept: bool,
    auto_complete: bool,
    rep_pd: Vec<u8>,
}

impl Net {
    fn new(seed: u64) -> Net {
        let mut b = Cm::new(config(B), seed ^ 0xB0B0_B0B0);
        b.listen(SID);
        Net {
            now: Instant::ZERO,
            cms: [Cm::new(config(A), seed), b],
            events: [Vec::new(), Vec::new()],
            wire: Vec::new(),
            inflight: VecDeque::new(),
            rng: Rng::new(seed ^ 0x1234_5678_9ABC_DEF0),
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            keep: Box::new(|_, _| true),
            auto_accept: true,
            auto_complete: true,
            rep_pd: b"CONNACK from b".to_vec(),
        }
    }

    fn lossy(seed: u64, loss: f64, dup: f64, reorder: f64) -> Net {
        Net { loss, dup, reorder, ..Net::new(seed) }
    }

    fn connect(&mut self) -> ConnId {
        self.cms[A].connect(self.now, params()).unwrap()
    }

    /// Moves MADs and reacts to events until nothing moves; time stands still.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            let mut progress = false;
            for side in [A, B] {
                while let Some((dest, mad)) = self.cms[side].poll_transmit() {
                    progress = true;
                    assert_eq!(dest, addr(1 - side), "MAD to the wrong port");
                    self.wire.push((self.now, side, mad));
                    if !(self.keep)(side, &decode(&mad)) || self.rng.chance(self.loss) {
                        continue;
                    }
                    let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
                    for _ in 0..copies {
                        if !self.inflight.is_empty() && self.rng.chance(self.reorder) {
                            let pos = self.rng.below(self.inflight.len() as u64 + 1) as usize;
                            self.inflight.insert(pos, (side, mad));
                        } else {
                            self.inflight.push_back((side, mad));
                        }
                    }
                }
            }
            while let Some((from, mad)) = self.inflight.pop_front() {
                progress = true;
                self.cms[1 - from].handle_mad(self.now, addr(from), &mad);
            }
            for side in [A, B] {
                while let Some(ev) = self.cms[side].poll_event() {
                    progress = true;
                    self.react(side, &ev);
                    self.events[side].push((self.now, ev));
                }
            }
            if !progress {
                return;
            }
        }
        panic!("the two CMs never went quiet");
    }

    fn react(&mut self, side: usize, ev: &CmEvent) {
        let (qpn, psn) = if side == A { (A_QPN, A_PSN) } else { (B_QPN, B_PSN) };
        match *ev {
            CmEvent::ConnectRequest { id, .. } if self.auto_accept => {
                self.cms[side].accept(self.now, id, qpn, psn, 7, &self.rep_pd).unwrap();
            }
            CmEvent::Reply { id, .. } if self.auto_complete => {
                self.cms[side].complete_connect(self.now, id).unwrap();
            }
            _ => {}
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        Instant::min_deadline(self.cms[A].poll_timeout(), self.cms[B].poll_timeout())
    }

    /// Runs timers and traffic until no timer is left.
    fn run(&mut self) {
        self.run_until(Instant::FAR_FUTURE);
    }

    /// Runs timers and traffic up to `end` (timers due later stay armed).
    fn run_until(&mut self, end: Instant) {
        for _ in 0..100_000 {
            self.settle();
            match self.next_deadline() {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    for cm in &mut self.cms {
                        cm.handle_timeout(self.now);
                    }
                }
                _ => return,
            }
        }
        panic!("timers never ran out");
    }

    fn events(&self, side: usize) -> Vec<CmEvent> {
        self.events[side].iter().map(|(_, e)| e.clone()).collect()
    }

    /// Times and bytes of the MADs named `kind` sent by `sender`.
    fn sent(&self, sender: usize, kind: &str) -> Vec<(Instant, Mad)> {
        self.wire
            .iter()
            .filter(|(_, s, m)| *s == sender && decode(m).name() == kind)
            .map(|(t, _, m)| (*t, *m))
            .collect()
    }

    /// The names of everything on the wire, in order, tagged with the sender.
    fn trace(&self) -> Vec<(usize, &'static str)> {
        self.wire.iter().map(|(_, s, m)| (*s, decode(m).name())).collect()
    }

    /// The id of the first ConnectRequest on `side`.
    fn request_id(&self, side: usize) -> ConnId {
        self.events[side]
            .iter()
            .find_map(|(_, e)| matches!(e, CmEvent::ConnectRequest { .. }).then(|| e.id()))
            .expect("no ConnectRequest")
    }

    /// Handshake with defaults; returns (active id, passive id).
    fn establish(&mut self) -> (ConnId, ConnId) {
        let a = self.connect();
        self.run();
        let b = self.request_id(B);
        assert_eq!(self.cms[A].state(a), Some(ConnState::Established));
        assert_eq!(self.cms[B].state(b), Some(ConnState::Established));
        (a, b)
    }
}

fn is_terminal(e: &CmEvent) -> bool {
    matches!(
        e,
        CmEvent::Rejected { .. }
            | CmEvent::Unreachable { .. }
            | CmEvent::ReplyTimedOut { .. }
            | CmEvent::Disconnected { .. }
    )
}

#[test]
fn handshake_carries_private_data_both_ways() {
    let mut net = Net::new(1);
    let a = net.connect();
    net.run();
    assert_eq!(net.trace(), [(A, "REQ"), (B, "REP"), (A, "RTU")]);
    let b = net.request_id(B);

    let expected_request = CmEvent::ConnectRequest {
        id: b,
        from: addr(A),
        service_id: SID,
        cma: CmaHeader { src_port: 1023, src: A_IP, dst: B_IP },
        private_data: consumer_pd(),
        remote_qpn: A_QPN,
        remote_start_psn: A_PSN,
        path_mtu: Mtu::Mtu1024,
        retry_count: 5,
        rnr_retry_count: 6,
        responder_resources: 2, // the REQ's initiator depth, seen from the passive side
        initiator_depth: 1,
        local_ack_timeout: 17,
        remote_ca_guid: A_GUID,
    };
    assert_eq!(net.events(B), [expected_request, CmEvent::Established { id: b }]);
    let mut rep_pd = [0u8; 196];
    rep_pd[..net.rep_pd.len()].copy_from_slice(&net.rep_pd);
    let reply = CmEvent::Reply {
        id: a,
        remote_qpn: B_QPN,
        remote_start_psn: B_PSN,
        private_data: rep_pd,
        rnr_retry_count: 7,
    };
    assert_eq!(net.events(A), [reply, CmEvent::Established { id: a }]);

    // TIDs: the REQ's is (hi << 32) | comm id; REP and RTU copy it.
    let req = net.sent(A, "REQ")[0].1;
    let rep = net.sent(B, "REP")[0].1;
    let rtu = net.sent(A, "RTU")[0].1;
    assert_eq!(tid(&req), net.cms[A].tid_of(a));
    assert_eq!(tid(&req) as u32, a.0);
    assert_eq!(tid(&rep), tid(&req));
    assert_eq!(tid(&rtu), tid(&req));

    // The REQ: RoCE defaults with this CM's timeouts and retries.
    let CmMessage::Req(r) = decode(&req) else { panic!("not a REQ") };
    assert_eq!(r.local_comm_id, a.0);
    assert_eq!(r.local_ca_guid, A_GUID);
    assert_eq!((r.remote_cm_response_timeout, r.local_cm_response_timeout, r.max_cm_retries), (12, 12, 15));
    assert_eq!(r.primary_path.local_gid, addr(A).gid);
    assert_eq!(r.primary_path.remote_gid, addr(B).gid);
    assert_eq!(r.primary_path.hop_limit, 64);
    assert_eq!(r.pkey, 0xFFFF);
    assert!(r.end_to_end_flow_control);
    let CmMessage::Rep(p) = decode(&rep) else { panic!("not a REP") };
    assert_eq!((p.local_comm_id, p.remote_comm_id, p.local_qpn, p.local_ca_guid), (b.0, a.0, B_QPN, B_GUID));
    let CmMessage::Rtu(u) = decode(&rtu) else { panic!("not an RTU") };
    assert_eq!((u.local_comm_id, u.remote_comm_id), (a.0, b.0));

    for cm in &net.cms {
        assert_eq!(cm.poll_timeout(), None, "no timer left once established");
        assert_eq!(cm.live(), 1);
        assert_eq!(cm.stats().retransmitted.total(), 0);
        assert_eq!(cm.stats().duplicates.total(), 0);
    }
    assert_eq!(net.cms[B].pending_requests(), 0);
}

#[test]
fn lost_req_is_retransmitted_identically() {
    let mut net = Net::new(2);
    net.keep = drop_first(A, "REQ", 1);
    let a = net.connect();
    net.run();
    let reqs = net.sent(A, "REQ");
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].1, reqs[1].1, "a retransmission is the identical MAD");
    assert_eq!(reqs[1].0, at(REQ_TIMEOUT));
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
    assert_eq!(net.cms[A].stats().retransmitted.req, 1);
    assert_eq!(net.cms[A].stats().sent.req, 2);
}

#[test]
fn lost_rep_is_retransmitted_identically() {
    let mut net = Net::new(3);
    net.keep = drop_first(B, "REP", 1);
    let a = net.connect();
    net.run();
    let reps = net.sent(B, "REP");
    assert_eq!(reps.len(), 2);
    assert_eq!(reps[0].1, reps[1].1);
    assert_eq!(reps[1].0, at(REP_TIMEOUT), "REP timer = 2^(REQ.LocalCMResponseTimeout - 8) ms");
    assert_eq!(net.sent(A, "REQ").len(), 1, "the REP timer is shorter than the REQ timer");
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
    assert_eq!(net.cms[B].state(net.request_id(B)), Some(ConnState::Established));
}

#[test]
fn silence_makes_the_attempt_unreachable_after_every_retry() {
    let mut net = Net::new(4);
    net.keep = Box::new(|_, _| false);
    let a = net.connect();
    net.run();
    assert_eq!(net.events[A], [(at(REQ_TIMEOUT * (RETRIES + 1)), CmEvent::Unreachable { id: a })]);
    let reqs = net.sent(A, "REQ");
    assert_eq!(reqs.len(), RETRIES as usize + 1);
    for (i, (t, m)) in reqs.iter().enumerate() {
        assert_eq!(*t, at(REQ_TIMEOUT * i as u32));
        assert_eq!(*m, reqs[0].1);
    }
    let s = net.cms[A].stats();
    assert_eq!((s.sent.req, s.retransmitted.req, s.req_timeouts), (16, 15, 1));
    assert_eq!(net.cms[A].live(), 0);
    assert_eq!(net.cms[A].poll_timeout(), None);
    assert!(net.events[B].is_empty());
}

#[test]
fn passive_side_times_out_without_rtu() {
    let mut net = Net::new(5);
    net.keep = drop_all(A, "RTU");
    let a = net.connect();
    net.run();
    let b = net.request_id(B);
    assert_eq!(
        net.events[B].last(),
        Some(&(at(REP_TIMEOUT * (RETRIES + 1)), CmEvent::ReplyTimedOut { id: b }))
    );
    assert_eq!(net.sent(B, "REP").len(), RETRIES as usize + 1);
    // Every REP retransmission drew a resent RTU (lost as well).
    assert_eq!(net.cms[A].stats().duplicates.rep, u64::from(RETRIES));
    let rtus = net.sent(A, "RTU");
    assert_eq!(rtus.len(), RETRIES as usize + 1);
    assert!(rtus.iter().all(|(_, m)| *m == rtus[0].1));
    assert_eq!(net.cms[B].stats().rep_timeouts, 1);
    assert_eq!(net.cms[B].live(), 0);
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
}

#[test]
fn comm_est_stands_in_for_a_lost_rtu() {
    let mut net = Net::new(6);
    net.keep = drop_all(A, "RTU");
    let a = net.connect();
    net.settle();
    let b = net.request_id(B);
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
    assert_eq!(net.cms[B].state(b), Some(ConnState::RepSent));
    assert_eq!(net.cms[B].poll_timeout(), Some(at(REP_TIMEOUT)));

    net.now += ms(3);
    net.cms[B].notify_comm_est(net.now, b);
    net.settle();
    assert_eq!(net.events(B).last(), Some(&CmEvent::Established { id: b }));
    assert_eq!(net.cms[B].state(b), Some(ConnState::Established));
    assert_eq!(net.cms[B].poll_timeout(), None, "the REP timer stopped");

    // A second COMM_EST and the late RTU change nothing.
    net.cms[B].notify_comm_est(net.now, b);
    let rtu = net.sent(A, "RTU")[0].1;
    net.cms[B].handle_mad(net.now, addr(A), &rtu);
    net.settle();
    assert_eq!(net.events(B).iter().filter(|e| matches!(e, CmEvent::Established { .. })).count(), 1);
    assert_eq!(net.cms[B].stats().duplicates.rtu, 1);
    net.run();
    assert_eq!(net.sent(B, "REP").len(), 1);
}

#[test]
fn reject_carries_private_data() {
    let mut net = Net::new(7);
    net.auto_accept = false;
    let a = net.connect();
    net.settle();
    let b = net.request_id(B);
    assert_eq!(net.cms[B].pending_requests(), 1);
    let data: Vec<u8> = (0..100).collect();
    net.cms[B].reject(net.now, b, RejReason::ConsumerDefined, &data).unwrap();
    net.settle();
    let mut expected = [0u8; 148];
    expected[..100].copy_from_slice(&data);
    assert_eq!(
        net.events(A),
        [CmEvent::Rejected { id: a, reason: RejReason::ConsumerDefined, private_data: expected }]
    );
    let rej = net.sent(B, "REJ")[0].1;
    assert_eq!(tid(&rej), net.cms[A].tid_of(a));
    let CmMessage::Rej(r) = decode(&rej) else { panic!("not a REJ") };
    assert_eq!((r.local_comm_id, r.remote_comm_id, r.message_rejected), (0, a.0, MessageRejected::Req));
    assert_eq!((net.cms[A].live(), net.cms[B].live(), net.cms[B].pending_requests()), (0, 0, 0));
    net.run();
    assert_eq!(net.sent(A, "REQ").len(), 1, "the REQ timer stopped");
}

#[test]
fn no_listener_gets_rej_8() {
    let mut net = Net::new(8);
    net.cms[B].unlisten(SID);
    net.cms[B].listen(ip_service_id(PortSpace::Tcp, 988));
    let a = net.connect();
    net.run();
    assert_eq!(net.events(A).len(), 1);
    let CmEvent::Rejected { id, reason, .. } = net.events(A)[0] else { panic!("{:?}", net.events(A)) };
    assert_eq!((id, reason), (a, RejReason::InvalidServiceId));
    assert!(net.events[B].is_empty());
    assert_eq!(net.cms[B].stats().rej_invalid_service_id, 1);
    assert_eq!((net.cms[A].live(), net.cms[B].live()), (0, 0));
}

#[test]
fn duplicate_req_is_dropped_and_rej_10_in_timewait() {
    let mut net = Net::new(9);
    net.auto_accept = false;
    let _a = net.connect();
    net.settle();
    let b = net.request_id(B);
    let req = net.sent(A, "REQ")[0].1;

    // REQ_RCVD: dropped.
    net.cms[B].handle_mad(net.now, addr(A), &req);
    assert_eq!(net.cms[B].poll_transmit(), None);
    assert_eq!(net.cms[B].poll_event(), None);
    // REP_SENT: dropped too (Linux does not resend the REP; its timer does).
    net.cms[B].accept(net.now, b, B_QPN, B_PSN, 7, &[]).unwrap();
    let _rep = net.cms[B].poll_transmit().unwrap();
    net.cms[B].handle_mad(net.now, addr(A), &req);
    assert_eq!(net.cms[B].poll_transmit(), None);
    assert_eq!(net.cms[B].stats().duplicates.req, 2);
    assert_eq!(net.cms[B].pending_requests(), 0);

    // TIMEWAIT (rejected after accepting): REJ 10.
    net.cms[B].reject(net.now, b, RejReason::ConsumerDefined, &[]).unwrap();
    let _rej = net.cms[B].poll_transmit().unwrap();
    assert_eq!(net.cms[B].state(b), Some(ConnState::Timewait));
    net.cms[B].handle_mad(net.now, addr(A), &req);
    let (_, mad) = net.cms[B].poll_transmit().unwrap();
    let CmMessage::Rej(r) = decode(&mad) else { panic!("not a REJ") };
    assert_eq!(
        (r.reason, r.local_comm_id, r.message_rejected),
        (RejReason::StaleConn, b.0, MessageRejected::Other)
    );
    assert_eq!(tid(&mad), tid(&req));
    assert_eq!(net.cms[B].stats().duplicates.req, 3);
    assert_eq!(net.cms[B].poll_event(), None);
}

#[test]
fn stale_req_gets_rej_10_and_the_old_connection_a_dreq() {
    let mut net = Net::new(10);
    let (a_old, b_old) = net.establish();
    // The active node restarts: same CA GUID and QPN, fresh comm IDs.
    net.cms[A] = Cm::new(config(A), 1010);
    let a_new = net.connect();
    assert_ne!(a_new, a_old);
    net.run();
    let CmEvent::Rejected { id, reason, .. } = net.events(A)[2] else { panic!("{:?}", net.events(A)) };
    assert_eq!((id, reason), (a_new, RejReason::StaleConn));
    assert_eq!(net.cms[B].stats().rej_stale_conn, 1);
    // The old connection got a DREQ, which the restarted node answered without knowing it.
    let dreq = net.sent(B, "DREQ")[0].1;
    let CmMessage::Dreq(d) = decode(&dreq) else { panic!("not a DREQ") };
    assert_eq!((d.local_comm_id, d.remote_comm_id, d.remote_qpn), (b_old.0, a_old.0, A_QPN));
    assert_eq!(net.cms[A].stats().unknown_comm_id, 1);
    assert_eq!(net.events(B).last(), Some(&CmEvent::Disconnected { id: b_old }));
    assert_eq!(net.events(B).iter().filter(|e| matches!(e, CmEvent::ConnectRequest { .. })).count(), 1);
    assert_eq!((net.cms[A].live(), net.cms[B].live()), (0, 0));
}

#[test]
fn disconnect_from_either_side_then_timewait_ends() {
    for initiator in [A, B] {
        let mut net = Net::new(11 + initiator as u64);
        let (a, b) = net.establish();
        let ids = [a, b];
        net.now += ms(50);
        let t0 = net.now;
        net.cms[initiator].disconnect(net.now, ids[initiator]).unwrap();
        net.settle();
        for side in [A, B] {
            assert_eq!(
                net.events(side).last(),
                Some(&CmEvent::Disconnected { id: ids[side] }),
                "side {side}"
            );
            assert_eq!(net.cms[side].state(ids[side]), Some(ConnState::Timewait));
        }
        assert_eq!(net.trace()[3..], [(initiator, "DREQ"), (1 - initiator, "DREP")]);
        // DREQ TID = (hi << 32) | comm id; the DREP copies it.
        let dreq = net.sent(initiator, "DREQ")[0].1;
        assert_eq!(tid(&dreq), net.cms[initiator].tid_of(ids[initiator]));
        assert_eq!(tid(&net.sent(1 - initiator, "DREP")[0].1), tid(&dreq));
        // Calling disconnect again is harmless.
        net.cms[initiator].disconnect(net.now, ids[initiator]).unwrap();
        net.cms[1 - initiator].disconnect(net.now, ids[1 - initiator]).unwrap();
        net.run_until(t0 + TIMEWAIT - ms(1));
        assert_eq!((net.cms[A].live(), net.cms[B].live()), (1, 1));
        net.run();
        assert_eq!(net.now, t0 + TIMEWAIT);
        assert_eq!((net.cms[A].live(), net.cms[B].live()), (0, 0));
        assert_eq!(net.wire.len(), 5, "nothing else was sent");
    }
}

#[test]
fn lost_dreq_is_retransmitted_and_all_lost_ends_by_timeout() {
    let mut net = Net::new(13);
    let (a, b) = net.establish();
    net.keep = drop_first(A, "DREQ", 1);
    net.cms[A].disconnect(net.now, a).unwrap();
    net.run();
    let dreqs = net.sent(A, "DREQ");
    assert_eq!(dreqs.len(), 2);
    assert_eq!(dreqs[0].1, dreqs[1].1);
    assert_eq!(dreqs[1].0.saturating_duration_since(dreqs[0].0), REQ_TIMEOUT);
    assert_eq!(net.events(B).last(), Some(&CmEvent::Disconnected { id: b }));
    assert_eq!((net.cms[A].live(), net.cms[B].live()), (0, 0));

    // Every DREQ lost: Disconnected after the retries, then TIMEWAIT (passive side: REP timer).
    let mut net = Net::new(14);
    let (a, b) = net.establish();
    net.keep = drop_all(B, "DREQ");
    let t0 = net.now;
    net.cms[B].disconnect(net.now, b).unwrap();
    net.run();
    let end = t0 + REP_TIMEOUT * (RETRIES + 1);
    assert_eq!(net.events[B].last(), Some(&(end, CmEvent::Disconnected { id: b })));
    assert_eq!(net.cms[B].stats().dreq_timeouts, 1);
    assert_eq!(net.cms[B].live(), 0);
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established), "a never heard of it");
}

#[test]
fn simultaneous_disconnects_report_once_each() {
    let mut net = Net::new(15);
    let (a, b) = net.establish();
    net.cms[A].disconnect(net.now, a).unwrap();
    net.cms[B].disconnect(net.now, b).unwrap();
    net.run();
    for (side, id) in [(A, a), (B, b)] {
        let n = net.events(side).iter().filter(|e| **e == CmEvent::Disconnected { id }).count();
        assert_eq!(n, 1, "side {side}");
        assert_eq!(net.cms[side].live(), 0);
    }
}

#[test]
fn destroy_in_req_sent_sends_rej_4_with_the_ca_guid() {
    let mut net = Net::new(16);
    net.auto_accept = false;
    let a = net.connect();
    net.settle();
    let b = net.request_id(B);
    net.cms[A].destroy(net.now, a);
    assert_eq!(net.cms[A].live(), 0);
    assert_eq!(net.cms[A].poll_timeout(), None);
    net.run();
    let rej = net.sent(A, "REJ")[0].1;
    assert_eq!(tid(&rej), net.cms[A].tid_of(a));
    let CmMessage::Rej(r) = decode(&rej) else { panic!("not a REJ") };
    assert_eq!(r.reason, RejReason::Timeout);
    assert_eq!((r.local_comm_id, r.remote_comm_id, r.message_rejected), (a.0, 0, MessageRejected::Other));
    assert_eq!(r.ari_bytes(), A_GUID.to_be_bytes());
    // The passive side matched it by (comm ID, CA GUID from the ARI).
    let CmEvent::Rejected { id, reason, .. } = net.events(B)[1] else { panic!("{:?}", net.events(B)) };
    assert_eq!((id, reason), (b, RejReason::Timeout));
    assert_eq!((net.cms[B].live(), net.cms[B].pending_requests()), (0, 0));
    assert!(net.events[A].is_empty(), "destroy reports nothing");

    // Events still queued for a destroyed id are discarded; a pending request draws REJ 28.
    let mut b = Cm::new(config(B), 160);
    b.listen(SID);
    b.handle_mad(net.now, addr(A), &req_mad(9, 9, A_GUID));
    let queued = b.events.front().map(CmEvent::id).expect("a ConnectRequest");
    b.destroy(net.now, queued);
    assert_eq!(b.poll_event(), None);
    assert_eq!((b.live(), b.pending_requests()), (0, 0));
    let CmMessage::Rej(r) = decode(&b.poll_transmit().unwrap().1) else { panic!("not a REJ") };
    assert_eq!((r.reason, r.local_comm_id, r.remote_comm_id), (RejReason::ConsumerDefined, 0, 9));
}

#[test]
fn destroy_established_sends_one_dreq() {
    let mut net = Net::new(17);
    let (a, b) = net.establish();
    net.cms[A].destroy(net.now, a);
    net.cms[A].destroy(net.now, a); // unknown now: ignored
    net.run();
    assert_eq!(net.sent(A, "DREQ").len(), 1);
    assert_eq!(net.events(B).last(), Some(&CmEvent::Disconnected { id: b }));
    // The DREP found no id on a.
    assert_eq!(net.cms[A].stats().unknown_comm_id, 1);
    assert_eq!((net.cms[A].live(), net.cms[B].live()), (0, 0));
}

#[test]
fn req_flood_is_bounded() {
    let mut b = Cm::new(config(B), 18);
    b.listen(SID);
    let now = Instant::ZERO;
    for i in 0..1500u32 {
        b.handle_mad(now, addr(A), &req_mad(1000 + i, 0x1000 + i, A_GUID));
    }
    assert_eq!(b.pending_requests(), DEFAULT_MAX_PENDING_REQUESTS);
    assert_eq!(b.live(), DEFAULT_MAX_PENDING_REQUESTS);
    assert_eq!(b.stats().rej_no_resources, 1500 - 1024);
    let mut requests = Vec::new();
    while let Some(e) = b.poll_event() {
        requests.push(e.id());
    }
    assert_eq!(requests.len(), 1024);
    let mut rejs = 0;
    while let Some((_, mad)) = b.poll_transmit() {
        let CmMessage::Rej(r) = decode(&mad) else { panic!("not a REJ") };
        assert_eq!(r.reason, RejReason::NoResources);
        rejs += 1;
    }
    assert_eq!(rejs, 1500 - 1024);
    // Answering one frees a slot.
    b.reject(now, requests[0], RejReason::ConsumerDefined, &[]).unwrap();
    b.handle_mad(now, addr(A), &req_mad(5000, 0x5000, A_GUID));
    assert!(matches!(b.poll_event(), Some(CmEvent::ConnectRequest { .. })));
    assert_eq!(b.pending_requests(), 1024);
    // Pending requests hold no timer; answering them all leaves nothing behind.
    assert_eq!(b.poll_timeout(), None);
    for id in requests.into_iter().skip(1) {
        b.destroy(now, id);
    }
    assert_eq!(b.pending_requests(), 1);
}

#[test]
fn duplicate_rep_when_established_resends_the_rtu() {
    let mut net = Net::new(19);
    let (a, _b) = net.establish();
    let rep = net.sent(B, "REP")[0].1;
    let rtu = net.sent(A, "RTU")[0].1;
    net.cms[A].handle_mad(net.now, addr(B), &rep);
    assert_eq!(net.cms[A].poll_transmit(), Some((addr(B), rtu)));
    assert_eq!(net.cms[A].stats().duplicates.rep, 1);
    assert_eq!(net.cms[A].poll_event(), None);
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
}

#[test]
fn mra_extends_the_req_timer() {
    let mut net = Net::new(20);
    net.auto_accept = false;
    let a = net.connect();
    net.settle();
    let b = net.request_id(B);
    assert_eq!(net.cms[A].poll_timeout(), Some(at(REQ_TIMEOUT)));
    net.now = at(ms(5));
    let mra = Mra {
        local_comm_id: b.0,
        remote_comm_id: a.0,
        message_mraed: MessageMraed::Req,
        service_timeout: 14,
        ..Mra::default()
    };
    let mad = CmMad::new(net.cms[A].tid_of(a), CmMessage::Mra(mra)).encode().unwrap();
    net.cms[A].handle_mad(net.now, addr(B), &mad);
    assert_eq!(net.cms[A].state(a), Some(ConnState::MraReqRcvd));
    // 2^(14-8) + 2^(17-8) ms after the MRA.
    assert_eq!(net.cms[A].poll_timeout(), Some(at(ms(5 + 64 + 512))));
    net.cms[A].handle_mad(net.now, addr(B), &mad);
    assert_eq!(net.cms[A].stats().duplicates.mra, 1);
    // The REP still completes the handshake.
    net.now = at(ms(100));
    net.cms[B].accept(net.now, b, B_QPN, B_PSN, 7, &[]).unwrap();
    net.run();
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
    assert_eq!(net.sent(A, "REQ").len(), 1);
}

#[test]
fn rej_after_rep_from_either_side() {
    // Passive rejects after accepting; the active side is in REP_RCVD.
    let mut net = Net::new(21);
    net.auto_complete = false;
    let a = net.connect();
    net.settle();
    let b = net.request_id(B);
    assert_eq!(net.cms[A].state(a), Some(ConnState::RepRcvd));
    net.cms[B].reject(net.now, b, RejReason::ConsumerDefined, b"nope").unwrap();
    assert_eq!(net.cms[B].state(b), Some(ConnState::Timewait));
    net.settle();
    let CmEvent::Rejected { id, reason, private_data } = net.events(A)[1] else {
        panic!("{:?}", net.events(A))
    };
    assert_eq!((id, reason, &private_data[..4]), (a, RejReason::ConsumerDefined, &b"nope"[..]));
    assert_eq!(net.cms[A].state(a), Some(ConnState::Timewait));
    assert_eq!(
        net.cms[A].complete_connect(net.now, a),
        Err(CmError::InvalidState { id: a, state: ConnState::Timewait, op: "complete_connect" })
    );
    net.run();
    assert_eq!((net.cms[A].live(), net.cms[B].live()), (0, 0));

    // The active side rejects the REP.
    let mut net = Net::new(22);
    net.auto_complete = false;
    let a = net.connect();
    net.settle();
    let b = net.request_id(B);
    net.cms[A].reject(net.now, a, RejReason::ConsumerDefined, &[]).unwrap();
    assert_eq!(net.cms[A].live(), 0);
    net.settle();
    let CmMessage::Rej(r) = decode(&net.sent(A, "REJ")[0].1) else { panic!("not a REJ") };
    assert_eq!((r.local_comm_id, r.remote_comm_id, r.message_rejected), (a.0, b.0, MessageRejected::Rep));
    let CmEvent::Rejected { id, reason, .. } = net.events(B)[1] else { panic!("{:?}", net.events(B)) };
    assert_eq!((id, reason), (b, RejReason::ConsumerDefined));
    assert_eq!(net.cms[B].live(), 0);
}

#[test]
fn user_errors_are_typed_and_change_nothing() {
    let mut net = Net::new(23);
    net.auto_accept = false;
    let bogus = ConnId(42);
    let now = net.now;
    assert_eq!(net.cms[B].accept(now, bogus, 1, 1, 7, &[]), Err(CmError::UnknownId(bogus)));
    assert_eq!(net.cms[B].disconnect(now, bogus), Err(CmError::UnknownId(bogus)));
    let mut p = params();
    p.qpn = 1 << 24;
    assert!(matches!(net.cms[A].connect(now, p), Err(CmError::Encode(MadError::FieldOutOfRange { .. }))));
    assert_eq!(net.cms[A].live(), 0);

    let a = net.connect();
    net.settle();
    let b = net.request_id(B);
    assert_eq!(
        net.cms[B].accept(now, b, 1, 1, 7, &[0; 197]),
        Err(CmError::PrivateDataTooLong { len: 197, max: 196 })
    );
    assert!(matches!(net.cms[B].accept(now, b, 1 << 24, 1, 7, &[]), Err(CmError::Encode(_))));
    assert!(matches!(net.cms[B].accept(now, b, 1, 1, 8, &[]), Err(CmError::Encode(_))));
    assert_eq!(
        net.cms[B].reject(now, b, RejReason::ConsumerDefined, &[0; 149]),
        Err(CmError::PrivateDataTooLong { len: 149, max: 148 })
    );
    assert_eq!(
        net.cms[A].complete_connect(now, a),
        Err(CmError::InvalidState { id: a, state: ConnState::ReqSent, op: "complete_connect" })
    );
    assert_eq!(
        net.cms[A].disconnect(now, a),
        Err(CmError::InvalidState { id: a, state: ConnState::ReqSent, op: "disconnect" })
    );
    assert_eq!(
        net.cms[A].accept(now, a, 1, 1, 7, &[]),
        Err(CmError::InvalidState { id: a, state: ConnState::ReqSent, op: "accept" })
    );
    assert_eq!(
        net.cms[A].reject(now, a, RejReason::ConsumerDefined, &[]),
        Err(CmError::InvalidState { id: a, state: ConnState::ReqSent, op: "reject" })
    );
    assert_eq!(net.cms[B].poll_transmit(), None);
    assert_eq!(net.cms[B].state(b), Some(ConnState::ReqRcvd));
    // Still fine afterwards.
    net.cms[B].accept(now, b, B_QPN, B_PSN, 7, &[]).unwrap();
    net.run();
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
}

#[test]
fn early_handle_timeout_is_a_no_op() {
    let mut net = Net::new(24);
    net.keep = Box::new(|_, _| false);
    let a = net.connect();
    net.settle();
    let before = net.cms[A].stats();
    net.cms[A].handle_timeout(at(REQ_TIMEOUT - Duration::from_nanos(1)));
    assert_eq!(net.cms[A].poll_transmit(), None);
    assert_eq!(net.cms[A].stats(), before);
    assert_eq!(net.cms[A].poll_timeout(), Some(at(REQ_TIMEOUT)));
    net.cms[A].handle_timeout(at(REQ_TIMEOUT));
    assert!(net.cms[A].poll_transmit().is_some());
    assert_eq!(net.cms[A].state(a), Some(ConnState::ReqSent));
}

#[test]
fn unknown_dreq_is_answered_and_wrong_qpn_ignored() {
    let mut b = Cm::new(config(B), 25);
    let dreq = Dreq { local_comm_id: 0x1111, remote_comm_id: 0x2222, remote_qpn: 9, ..Dreq::default() };
    let mad = CmMad::new(0xDEAD_BEEF, CmMessage::Dreq(dreq)).encode().unwrap();
    b.handle_mad(Instant::ZERO, addr(A), &mad);
    let (dest, reply) = b.poll_transmit().unwrap();
    assert_eq!(dest, addr(A));
    assert_eq!(tid(&reply), 0xDEAD_BEEF);
    let CmMessage::Drep(d) = decode(&reply) else { panic!("not a DREP") };
    assert_eq!((d.local_comm_id, d.remote_comm_id), (0x2222, 0x1111));
    assert_eq!(b.stats().unknown_comm_id, 1);

    let mut net = Net::new(26);
    let (a, b) = net.establish();
    let dreq = Dreq { local_comm_id: b.0, remote_comm_id: a.0, remote_qpn: A_QPN + 1, ..Dreq::default() };
    let mad = CmMad::new(1, CmMessage::Dreq(dreq)).encode().unwrap();
    net.cms[A].handle_mad(net.now, addr(B), &mad);
    assert_eq!(net.cms[A].poll_transmit(), None);
    assert_eq!(net.cms[A].stats().dreq_qpn_mismatch, 1);
    assert_eq!(net.cms[A].state(a), Some(ConnState::Established));
}

#[test]
fn invalid_requests_are_refused() {
    let mut b = Cm::new(config(B), 27);
    b.listen(SID);
    let now = Instant::ZERO;
    let refused = |b: &mut Cm, mad: &Mad| -> RejReason {
        b.handle_mad(now, addr(A), mad);
        assert_eq!(b.poll_event(), None);
        assert_eq!(b.live(), 0);
        let (_, out) = b.poll_transmit().expect("a REJ");
        let CmMessage::Rej(r) = decode(&out) else { panic!("not a REJ") };
        r.reason
    };
    let edit = |f: &dyn Fn(&mut Req)| -> Mad {
        let CmMessage::Req(mut r) = decode(&req_mad(77, 0x77, A_GUID)) else { unreachable!() };
        f(&mut r);
        CmMad::new(5, CmMessage::Req(r)).encode().unwrap()
    };
    assert_eq!(
        refused(&mut b, &edit(&|r| r.transport_type = TransportType::Uc)),
        RejReason::InvalidTransportType
    );
    assert_eq!(refused(&mut b, &edit(&|r| r.primary_path.remote_gid = addr(A).gid)), RejReason::InvalidGid);
    assert_eq!(refused(&mut b, &edit(&|r| r.private_data[0] = 0x10)), RejReason::ConsumerDefined);
    let wrong_dst = CmaHeader { src_port: 1, src: A_IP, dst: Ipv4Addr::new(10, 9, 9, 9) };
    let pd = req_private_data(&wrong_dst, &[]).unwrap();
    assert_eq!(refused(&mut b, &edit(&|r| r.private_data = pd)), RejReason::ConsumerDefined);
    b.handle_mad(now, addr(A), &edit(&|r| r.local_comm_id = 0));
    assert_eq!(b.poll_transmit(), None);
    assert_eq!(b.stats().invalid_req, 5);
    // The same REQ unedited is fine.
    b.handle_mad(now, addr(A), &req_mad(77, 0x77, A_GUID));
    assert!(matches!(b.poll_event(), Some(CmEvent::ConnectRequest { .. })));
}

/// One lossy handshake + disconnect; returns the wire log and both event logs.
fn lossy_run(seed: u64) -> Net {
    let mut net = Net::lossy(seed, 0.2, 0.05, 0.2);
    let a = net.connect();
    net.run_until(at(ms(2_000)));
    if net.cms[A].state(a) == Some(ConnState::Established) {
        net.cms[A].disconnect(net.now, a).unwrap();
    }
    net.run();
    net
}

#[test]
fn lossy_handshakes_always_finish_cleanly() {
    let mut established = 0;
    for seed in 0..300u64 {
        let net = lossy_run(seed);
        for side in [A, B] {
            // Every id ends with exactly one terminal event; nothing is left behind.
            let mut ids: Vec<ConnId> = net.events(side).iter().map(CmEvent::id).collect();
            ids.sort();
            ids.dedup();
            for id in ids {
                let terminal = net.events(side).iter().filter(|e| e.id() == id && is_terminal(e)).count();
                assert_eq!(terminal, 1, "seed {seed} side {side} id {id}: {:?}", net.events(side));
            }
            assert_eq!(net.cms[side].live(), 0, "seed {seed} side {side}: {:?}", net.events(side));
            assert_eq!(net.cms[side].poll_timeout(), None, "seed {seed}");
        }
        let a_events = net.events(A);
        assert!(
            matches!(a_events.first(), Some(CmEvent::Reply { .. }) | Some(CmEvent::Unreachable { .. })),
            "seed {seed}: {a_events:?}"
        );
        if a_events.contains(&CmEvent::Established { id: a_events[0].id() }) {
            established += 1;
        }
    }
    // 20 % loss against 16 tries: failures are astronomically rare.
    assert_eq!(established, 300);
}

#[test]
fn same_seed_same_bytes() {
    for seed in [1u64, 99, 12345] {
        let x = lossy_run(seed);
        let y = lossy_run(seed);
        assert_eq!(x.wire, y.wire, "seed {seed}");
        assert_eq!(x.events, y.events, "seed {seed}");
    }
    assert_ne!(lossy_run(1).wire, lossy_run(2).wire);
}

/// xorshift64*, for the fuzz loop.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn fuzzed_mads_never_panic_and_outputs_stay_valid() {
    let seed = 0x5EED_F00D_u64;
    let mut rng = XorShift(seed);
    // A corpus of every message type from real exchanges.
    let mut corpus: Vec<Mad> = Vec::new();
    for s in 0..4 {
        corpus.extend(lossy_run(s).wire.iter().map(|(_, _, m)| *m));
    }
    let mut net = Net::new(seed);
    for cm in &mut net.cms {
        cm.cfg.max_pending_requests = 8;
        cm.listen(SID);
    }
    let (a, b) = net.establish();
    net.auto_complete = false;
    let _pending = net.connect();
    net.settle();
    let mut known: Vec<u32> = vec![a.0, b.0, _pending.0];

    for round in 0..100_000u32 {
        let mut mad: Vec<u8> = match rng.below(4) {
            0 => {
                let len = rng.below(300);
                (0..len).map(|_| rng.next() as u8).collect()
            }
            1 => {
                // A valid header and random class data.
                let mut m = corpus[rng.below(corpus.len())].to_vec();
                for b in m.iter_mut().skip(24) {
                    *b = rng.next() as u8;
                }
                m
            }
            _ => {
                let mut m = corpus[rng.below(corpus.len())].to_vec();
                for _ in 0..1 + rng.below(8) {
                    let i = rng.below(m.len());
                    m[i] ^= 1 << rng.below(8);
                }
                m
            }
        };
        // Steer comm IDs towards live ones to reach deep states.
        let side = rng.below(2);
        let mut pairs: Vec<(u32, u32)> =
            net.cms[side].conns.iter().map(|(&id, c)| (id, c.remote_comm_id)).collect();
        pairs.sort_unstable();
        if mad.len() == 256 && !pairs.is_empty() && rng.below(3) == 0 {
            // Address a live id of the receiver exactly as its peer would.
            let (local, remote) = pairs[rng.below(pairs.len())];
            mad[28..32].copy_from_slice(&local.to_be_bytes());
            mad[24..28].copy_from_slice(&remote.to_be_bytes());
        } else if mad.len() == 256 {
            for off in [24, 28] {
                if rng.below(2) == 0 {
                    let id = known[rng.below(known.len())];
                    mad[off..off + 4].copy_from_slice(&id.to_be_bytes());
                }
            }
        }
        if rng.below(50) == 0 {
            mad.truncate(rng.below(256));
        }
        let from = addr(rng.below(2));
        net.cms[side].handle_mad(net.now, from, &mad);
        if rng.below(20) == 0 {
            net.now += Duration::from_millis(rng.below(200) as u64);
            net.cms[A].handle_timeout(net.now);
            net.cms[B].handle_timeout(net.now);
        }
        for side in [A, B] {
            while let Some((_, out)) = net.cms[side].poll_transmit() {
                assert!(CmMad::decode(&out).is_ok(), "seed {seed:#x} round {round}: a Cm emitted garbage");
            }
            while let Some(ev) = net.cms[side].poll_event() {
                known.push(ev.id().0);
                let id = ev.id();
                let now = net.now;
                // Answer some requests, so every state gets visited.
                match (ev, rng.below(3)) {
                    (CmEvent::ConnectRequest { .. }, 0) => {
                        net.cms[side].accept(now, id, B_QPN, B_PSN, 7, &[1, 2, 3]).unwrap();
                    }
                    (CmEvent::ConnectRequest { .. }, 1) => {
                        net.cms[side].reject(now, id, RejReason::ConsumerDefined, &[]).unwrap();
                    }
                    (CmEvent::Reply { .. }, 0) => net.cms[side].complete_connect(now, id).unwrap(),
                    (CmEvent::Established { .. }, 0) => net.cms[side].disconnect(now, id).unwrap(),
                    _ => {}
                }
            }
            let cm = &net.cms[side];
            assert!(cm.pending_requests() <= 8, "seed {seed:#x} round {round}: {}", cm.pending_requests());
            assert!(cm.live() <= 200, "seed {seed:#x} round {round}: {} live ids", cm.live());
        }
        if known.len() > 64 {
            known.drain(3..known.len() - 32);
        }
    }
    let stats = net.cms[A].stats();
    assert!(stats.undecodable > 0 && stats.received.total() > 0, "seed {seed:#x}: {stats:?}");
    // Whatever the fuzz left behind winds down once the inputs stop.
    for side in [A, B] {
        let ids: Vec<u32> = known.clone();
        for id in ids {
            net.cms[side].destroy(net.now, ConnId(id));
        }
        for _ in 0..10_000 {
            let Some(t) = net.cms[side].poll_timeout() else { break };
            net.cms[side].handle_timeout(t);
            while net.cms[side].poll_transmit().is_some() {}
            while net.cms[side].poll_event().is_some() {}
        }
        assert_eq!(net.cms[side].poll_timeout(), None, "seed {seed:#x}");
    }
}

#[test]
fn comm_ids_stay_in_their_partition() {
    for (index, count) in [(0u32, 1u32), (0, 2), (1, 2), (2, 3), (4, 5)] {
        let cfg = CmConfig { id_partition: (index, count), ..config(A) };
        let mut cm = Cm::new(cfg, 0x1234 + u64::from(index));
        for _ in 0..200 {
            let id = cm.connect(at(ms(0)), params()).unwrap();
            assert_eq!(id.0 % count, index, "({index}, {count})");
            assert_ne!(id.0, 0);
        }
    }
}
