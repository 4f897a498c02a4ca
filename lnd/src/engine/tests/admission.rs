//! Admission: who may connect. Connection requests are accepted only for this interface's
//! network, NID and service; `accept_nids` narrows them to a list of peers;
//! `require_privileged_port` refuses requests whose IP CM header names a source port ≥ 1024; a
//! flood of garbage REQs is refused, counted and leaves the other connections working.

use lnet_shim::event::Errno;
use lnet_shim::nid::Nid;

use super::*;
use crate::cm::ip_cm::{PortSpace, REQ_CONSUMER_DATA_LEN, ip_service_id};
use crate::cm::{Cm, CmConfig, ConnectParams};
use crate::fabric::Mtu;
use crate::fabric::soft::{FaultConfig, SoftConfig};
use crate::wire::{ConnParams, IBLND_MSG_SIZE, IBLND_MSG_VERSION, MsgHeader, MsgType};

fn allow(nids: &[Nid]) -> Tunables {
    let mut t = tunables();
    t.accept_nids = nids.to_vec();
    t
}

#[test]
fn a_peer_outside_accept_nids_is_rejected_fatal_and_counted_while_listed_peers_connect() {
    let s = seed();
    let mut sim = Sim::new(s, 3, &tunables(), FaultConfig::NONE);
    sim.add_node(0, allow(&[nid(2)]), FaultConfig::NONE, SoftConfig::default(), 1000);
    sim.put(1, 0, 1, 100);
    let r = sim.wait_send(1, 1, 200_000).unwrap_err();
    // FATAL is not retried: the send fails at once with "connection refused".
    assert_eq!(r.errno, Errno::ECONNREFUSED, "seed {s}: {r:?}");
    let st = sim.nodes[0].engine.stats();
    assert_eq!((st.accepts_refused_nid, st.accepts_rejected), (1, 1), "seed {s}: {st:?}");
    assert_eq!(sim.nodes[1].engine.stats().connects_rejected, 1, "seed {s}");
    assert!(sim.nodes[0].engine.conn_details(nid(1)).is_empty(), "seed {s}");
    sim.gather();
    assert!(!sim.recvs.contains_key(&(0, 1)), "seed {s}: nothing delivered");

    let sink = sim.put(2, 0, 2, 10_000);
    assert!(sim.wait_send(2, 2, 200_000).is_ok(), "seed {s}: the listed peer connects");
    assert_eq!(sink.to_vec(0, 3).unwrap(), vec![pattern_byte(2, 0), pattern_byte(2, 1), pattern_byte(2, 2)]);
    assert_eq!(sim.nodes[0].engine.stats().accepts_refused_nid, 1, "seed {s}");
    // Active connections are not filtered: node 0 may still reach node 1.
    sim.put(0, 1, 3, 100);
    assert!(sim.wait_send(0, 3, 200_000).is_ok(), "seed {s}");
}

#[test]
fn an_empty_accept_nids_accepts_every_peer_of_the_network() {
    let s = seed();
    let mut sim = Sim::new(s, 3, &allow(&[]), FaultConfig::NONE);
    sim.put(1, 0, 1, 100);
    sim.put(2, 0, 2, 100);
    assert!(sim.wait_send(1, 1, 200_000).is_ok(), "seed {s}");
    assert!(sim.wait_send(2, 2, 200_000).is_ok(), "seed {s}");
    assert_eq!(sim.nodes[0].engine.stats().accepts_rejected, 0, "seed {s}");
}

#[test]
fn a_request_for_another_service_finds_no_listener() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    let mut other = tunables();
    other.service = 988;
    sim.add_node(1, other, FaultConfig::NONE, SoftConfig::default(), 1001);
    sim.put(1, 0, 1, 100);
    let r = sim.wait_send(1, 1, 200_000).unwrap_err();
    assert_eq!(r.errno, Errno::EHOSTUNREACH, "seed {s}");
    assert_eq!(sim.nodes[0].engine.cm_stats().rej_invalid_service_id, 1, "seed {s}");
    assert_eq!(sim.nodes[0].engine.stats().conns_established, 0, "seed {s}");
}

#[test]
fn require_privileged_port_refuses_a_request_from_an_unprivileged_port() {
    let s = seed();
    let mut strict = tunables();
    strict.require_privileged_port = true;
    let mut loose = tunables();
    loose.use_privileged_port = false;
    let mut sim = Sim::new(s, 3, &tunables(), FaultConfig::NONE);
    sim.add_node(0, strict, FaultConfig::NONE, SoftConfig::default(), 1000);
    sim.add_node(1, loose, FaultConfig::NONE, SoftConfig::default(), 1001);
    sim.put(1, 0, 1, 100);
    assert_eq!(sim.wait_send(1, 1, 200_000).unwrap_err().errno, Errno::ECONNREFUSED, "seed {s}");
    assert_eq!(sim.nodes[0].engine.stats().accepts_rejected, 1, "seed {s}");
    // Node 2 binds privileged ports (the default) and is accepted.
    sim.put(2, 0, 2, 100);
    assert!(sim.wait_send(2, 2, 200_000).is_ok(), "seed {s}");
}

/// A CM without an engine on its own device: it sends REQs carrying garbage instead of a
/// CONNREQ, as fast as its transmit queue allows.
struct Flooder {
    dev: SoftDevice,
    cm: Cm,
    rng: Rng,
    /// The QPN of the next REQ: each REQ names a QP of its own, as a real peer's would (two
    /// live REQs naming one QPN are a stale connection, refused by the CM rather than by the
    /// engine's admission).
    next_qpn: u32,
}

impl Flooder {
    fn new(sim: &Sim, at: usize) -> Flooder {
        let dev = SoftDevice::open_sim(
            &sim.net,
            ip(at),
            SoftConfig { seed: sim.seed ^ 77, ..SoftConfig::default() },
        );
        let port = dev.query_port();
        let cfg = CmConfig::roce(port.addr, ip(at), dev.query_device().node_guid);
        let mut rng = Rng::new(sim.seed ^ 79);
        let next_qpn = 0x100 + rng.below(0x1000) as u32;
        Flooder { dev, cm: Cm::new(cfg, sim.seed ^ 78), rng, next_qpn }
    }

    fn connect(&mut self, now: Instant, to: usize) {
        let mut private_data = [0u8; REQ_CONSUMER_DATA_LEN];
        for b in &mut private_data {
            *b = self.rng.below(256) as u8;
        }
        self.connect_with(now, to, private_data);
    }

    /// A well-formed CONNREQ from `src` to `dst`, whatever this device's address.
    fn connect_as(&mut self, now: Instant, to: usize, src: Nid, dst: Nid) {
        let mut private_data = [0u8; REQ_CONSUMER_DATA_LEN];
        let cp = ConnParams { queue_depth: 8, max_frags: 256, max_msg_size: IBLND_MSG_SIZE as u32 };
        let nob = crate::wire::init_connparams(&mut private_data, &cp).unwrap();
        let hdr = MsgHeader {
            version: IBLND_MSG_VERSION,
            msg_type: MsgType::ConnReq,
            credits: 0,
            nob,
            cksum: 0,
            srcnid: src,
            srcstamp: 4242,
            dstnid: dst,
            dststamp: 0,
        };
        crate::wire::pack_header(&mut private_data, &hdr, false).unwrap();
        self.connect_with(now, to, private_data);
    }

    fn connect_with(&mut self, now: Instant, to: usize, private_data: [u8; REQ_CONSUMER_DATA_LEN]) {
        self.next_qpn += 1;
        let p = ConnectParams {
            dest: self.dev.resolve(ip(to)).unwrap(),
            dest_ip: ip(to),
            src_port: 1000,
            service_id: ip_service_id(PortSpace::Tcp, tunables().service),
            qpn: self.next_qpn - 1,
            start_psn: 1,
            path_mtu: Mtu::Mtu1024,
            retry_count: 5,
            rnr_retry_count: 6,
            responder_resources: 0,
            initiator_depth: 0,
            local_ack_timeout: 14,
            private_data,
        };
        let _ = self.cm.connect(now, p);
    }

    fn pump(&mut self, now: Instant) {
        let _ = self.dev.progress(now);
        while let Some((from, mad)) = self.dev.recv_mad() {
            self.cm.handle_mad(now, from, &mad);
        }
        self.cm.handle_timeout(now);
        while self.cm.poll_event().is_some() {}
        while let Some((to, mad)) = self.cm.poll_transmit() {
            let _ = self.dev.send_mad(&to, &mad);
        }
        let _ = self.dev.progress(now);
    }
}

#[test]
fn a_flood_of_garbage_reqs_is_refused_counted_and_other_connections_keep_working() {
    let s = seed();
    let mut sim = Sim::new(s, 3, &tunables(), FaultConfig::NONE);
    let mut flood = Flooder::new(&sim, 9);
    sim.put(0, 2, 1, 100);
    assert!(sim.wait_send(0, 1, 200_000).is_ok(), "seed {s}");
    let (rounds, per_round) = (40u64, 25u64);
    let mut tag = 100;
    for _ in 0..rounds {
        for _ in 0..per_round {
            flood.connect(sim.now, 0);
        }
        flood.pump(sim.now);
        // Node 2 keeps PUTting to node 0 during the flood.
        tag += 1;
        let sink = sim.put(2, 0, tag, 50_000);
        for _ in 0..200 {
            sim.step();
            flood.pump(sim.now);
        }
        assert!(sim.wait_send(2, tag, 200_000).is_ok(), "seed {s}: node 2 served during the flood");
        assert!(sink.to_vec(0, 50_000).unwrap().iter().enumerate().all(|(i, &x)| x == pattern_byte(tag, i)));
    }
    for _ in 0..2000 {
        sim.step();
        flood.pump(sim.now);
    }
    let sent = rounds * per_round;
    let st = sim.nodes[0].engine.stats();
    let cm = sim.nodes[0].engine.cm_stats();
    println!("REQ flood: {sent} garbage REQs; node 0 rejected {} ({cm:?})", st.accepts_rejected);
    assert_eq!(st.accepts_rejected, sent, "seed {s}: every garbage REQ refused once: {st:?} {cm:?}");
    assert_eq!(st.conns_established, 1, "seed {s}: only node 2's connection");
    assert_eq!(sim.nodes[0].engine.connections(), 1, "seed {s}");
    assert_eq!(sim.nodes[0].engine.conn_details(nid(2)).len(), 1, "seed {s}");
    assert!(sim.nodes[0].engine.cm_live() <= 1 + 1, "seed {s}: the CM holds no flood ids");
}

#[test]
fn requests_for_another_network_nid_or_address_are_rejected_and_a_proper_one_is_not() {
    let s = seed();
    let mut sim = Sim::new(s, 3, &tunables(), FaultConfig::NONE);
    let mut peer = Flooder::new(&sim, 9);
    let o2ib1: Nid = format!("{}@o2ib1", ip(9)).parse().unwrap();
    let cases = [
        ("source on another network", o2ib1, nid(0)),
        ("addressed to another NID", nid(9), nid(1)),
        ("claiming another peer's NID (spoofed address)", nid(2), nid(0)),
    ];
    for (i, (what, src, dst)) in cases.into_iter().enumerate() {
        peer.connect_as(sim.now, 0, src, dst);
        for _ in 0..200 {
            peer.pump(sim.now);
            sim.step();
        }
        let st = sim.nodes[0].engine.stats();
        assert_eq!(st.accepts_rejected, i as u64 + 1, "seed {s}: {what}: {st:?}");
    }
    // The same peer, telling the truth, is not rejected.
    peer.connect_as(sim.now, 0, nid(9), nid(0));
    for _ in 0..200 {
        peer.pump(sim.now);
        sim.step();
    }
    assert_eq!(sim.nodes[0].engine.stats().accepts_rejected, cases.len() as u64, "seed {s}");
}
