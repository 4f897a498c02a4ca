//! A misbehaving peer: node 1's wire rewrites one o2iblnd message it sends (and reseals the
//! ICRC, so the transport delivers it). Node 0 must close only its connection to node 1, fail
//! what it had pending there exactly once, write nothing outside the buffers LNet gave it, and
//! keep serving node 2. The same wire also loses node 1's CM RTUs, for the messages that
//! arrive before (or instead of) them.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};

use lnet_shim::buffer::Buffer;
use lnet_shim::event::Errno;
use lnet_shim::lnd::{Frag, Frags, Health, PeerState};

use super::*;
use crate::fabric::soft::packet::{self, Headers, IcrcMeta, Opcode, ROCEV2_UDP_PORT, Reth};
use crate::fabric::soft::wire::{Received, Wire};
use crate::fabric::soft::{FaultConfig, SimPort, SoftConfig, SoftDevice};
use crate::wire::{IBLND_MSG_MAGIC, MsgType};

pub(super) type Rule = Box<dyn FnMut(&mut Vec<u8>) -> bool + Send>;

/// Rewrites the RDMA ETH of an RDMA WRITE (FIRST or ONLY) frame; true if it changed it.
pub(super) type WriteRule = Box<dyn FnMut(&mut Reth) -> bool + Send>;

/// What node 1's wire does to what it sends (see [`TamperWire`]).
#[derive(Default)]
pub(super) struct Tamper {
    pub(super) rule: Option<Rule>,
    pub(super) rep_rule: Option<Rule>,
    pub(super) write_rule: Option<WriteRule>,
    pub(super) rtus: u32,
}

/// A wire that lets `rule` rewrite the o2iblnd message in an RC SEND ONLY frame, once, lets
/// `rep_rule` rewrite the first CM REP MAD it sends, lets `write_rule` rewrite the RDMA ETH of
/// every RDMA WRITE it sends, and drops the first `rtus_to_drop` CM RTUs it sends.
struct TamperWire {
    inner: SimPort,
    rule: Arc<Mutex<Option<Rule>>>,
    rep_rule: Option<Rule>,
    write_rule: Option<WriteRule>,
    rtus_to_drop: u32,
}

/// Whether `pkt` carries a CM MAD (on QP1) with attribute ID `attr`.
fn is_mad(pkt: &packet::Packet<'_>, attr: u16) -> bool {
    pkt.headers.bth.opcode == Opcode::UdSendOnly
        && pkt.payload.len() >= crate::cm::mad::MAD_LEN
        && pkt.payload.get(16..18) == Some(&attr.to_be_bytes()[..])
}

/// Whether `pkt` carries a CM RTU.
fn is_rtu(pkt: &packet::Packet<'_>) -> bool {
    is_mad(pkt, crate::cm::mad::attr::RTU)
}

impl TamperWire {
    /// Sends a frame of `headers` and `payload`, the ICRC resealed.
    fn send_rewritten(
        &mut self,
        now: Instant,
        dst: Ipv4Addr,
        headers: &Headers,
        payload: &[u8],
    ) -> io::Result<()> {
        let meta = IcrcMeta::new(self.inner.local_ip(), dst, ROCEV2_UDP_PORT, ROCEV2_UDP_PORT);
        let mut out = Vec::new();
        packet::build(&meta, headers, payload, &mut out).map_err(io::Error::other)?;
        self.inner.send(now, dst, &out)
    }
}

impl Wire for TamperWire {
    fn local_ip(&self) -> Ipv4Addr {
        self.inner.local_ip()
    }
    fn udp_port(&self) -> u16 {
        self.inner.udp_port()
    }
    fn send(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()> {
        if self.rtus_to_drop > 0 && packet::parse_unchecked(frame).is_ok_and(|p| is_rtu(&p)) {
            self.rtus_to_drop -= 1;
            return Ok(());
        }
        let Ok(pkt) = packet::parse_unchecked(frame) else { return self.inner.send(now, dst, frame) };
        if is_mad(&pkt, crate::cm::mad::attr::REP) {
            if let Some(mut r) = self.rep_rule.take() {
                let mut mad = pkt.payload.to_vec();
                if r(&mut mad) {
                    return self.send_rewritten(now, dst, &pkt.headers, &mad);
                }
                self.rep_rule = Some(r);
            }
        }
        if let (Some(r), Some(mut reth)) = (self.write_rule.as_mut(), pkt.headers.reth) {
            if r(&mut reth) {
                let headers = Headers { reth: Some(reth), ..pkt.headers };
                return self.send_rewritten(now, dst, &headers, pkt.payload);
            }
        }
        let rule = Arc::clone(&self.rule);
        let mut rule = rule.lock().unwrap();
        let is_msg = pkt.headers.bth.opcode == Opcode::RcSendOnly
            && pkt.payload.get(..4) == Some(&IBLND_MSG_MAGIC.to_le_bytes()[..]);
        if let Some(r) = rule.as_mut().filter(|_| is_msg) {
            let mut msg = pkt.payload.to_vec();
            if r(&mut msg) {
                *rule = None;
                return self.send_rewritten(now, dst, &pkt.headers, &msg);
            }
        }
        drop(rule);
        self.inner.send(now, dst, frame)
    }
    fn recv(&mut self, now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>> {
        self.inner.recv(now, buf)
    }
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
    fn next_deadline(&self) -> Option<Instant> {
        self.inner.next_deadline()
    }
}

/// Three nodes; node 1's outgoing messages pass through `rule`.
fn sim_with_hostile(s: u64, rule: Rule) -> Sim {
    sim_with_hostile_dropping_rtus(s, rule, 0)
}

/// [`sim_with_hostile`], and node 1's first `rtus` CM RTUs are lost.
fn sim_with_hostile_dropping_rtus(s: u64, rule: Rule, rtus: u32) -> Sim {
    sim_with_tamper(s, Tamper { rule: Some(rule), rtus, ..Tamper::default() })
}

/// Three nodes; `rep_rule` rewrites the first CM REP node 1 sends (returning true once it did).
fn sim_with_hostile_rep(s: u64, rep_rule: Rule) -> Sim {
    sim_with_tamper(s, Tamper { rep_rule: Some(rep_rule), ..Tamper::default() })
}

/// Three nodes with default tunables; node 1's wire does what `t` says.
pub(super) fn sim_with_tamper(s: u64, t: Tamper) -> Sim {
    let mut sim = Sim::new(s, 3, &tunables(), FaultConfig::NONE);
    let wire = TamperWire {
        inner: sim.net.attach(ip(1)),
        rule: Arc::new(Mutex::new(t.rule)),
        rep_rule: t.rep_rule,
        write_rule: t.write_rule,
        rtus_to_drop: t.rtus,
    };
    let dev = SoftDevice::with_wire(Box::new(wire), SoftConfig { seed: s ^ 1, ..SoftConfig::default() });
    let lnet = Arc::new(TestLnet::default());
    let cfg = EngineConfig::new(nid(1), tunables(), 1001, s ^ 0x1111);
    let mut engine = Engine::new(dev, cfg, lnet.clone()).unwrap();
    engine.set_poll_all_cqs(true);
    sim.nodes[1] = Node { engine, lnet, nid: nid(1) };
    sim
}

fn msg_type(msg: &[u8]) -> Option<MsgType> {
    msg.get(6).and_then(|&t| MsgType::from_u8(t))
}

/// Rewrites the first message of type `t` with `edit`.
fn on_type(t: MsgType, mut edit: impl FnMut(&mut Vec<u8>) + Send + 'static) -> Rule {
    Box::new(move |m: &mut Vec<u8>| {
        if msg_type(m) == Some(t) {
            edit(m);
            true
        } else {
            false
        }
    })
}

/// Node 0 ends up with no connection to node 1, had `expect` closing errors, and still talks
/// to node 2.
/// Node 1 serves `len` pattern bytes for match bits `tag`; node 0 GETs them (LNet token
/// `tag`) into the sink returned.
fn get_from_node_1(sim: &mut Sim, tag: u64, len: usize) -> Arc<Buffer> {
    sim.nodes[1].lnet.post_source(tag, vec![Frag::whole(filled(tag, len))]);
    let sink = Arc::new(Buffer::new(len));
    let (a, b) = (nid(0), nid(1));
    let get = lnet_shim::lnd::LndSend {
        target: b,
        hdr: get_hdr(a, b, tag, len),
        payload: Frags::new(),
        get_sink: Some(Frag::whole(sink.clone()).into()),
        token: tag,
    };
    sim.nodes[0].engine.send(sim.now, get).unwrap();
    sink
}

fn assert_only_the_hostile_connection_closed(sim: &mut Sim, s: u64) {
    let ok = sim.run_until(2_000_000, |sim| sim.nodes[0].engine.conn_details(nid(1)).is_empty());
    assert!(ok, "seed {s}: node 0 closed its connection to the hostile peer");
    let sink = sim.put(0, 2, 900, 70_000);
    assert!(sim.wait_send(0, 900, 2_000_000).is_ok(), "seed {s}: node 2 still served");
    assert!(sink.to_vec(0, 70_000).unwrap().iter().enumerate().all(|(i, &x)| x == pattern_byte(900, i)));
    assert_eq!(sim.nodes[0].engine.conn_details(nid(2)).len(), 1, "seed {s}");
}

/// Node 1 sends an IMMEDIATE PUT to node 0 that `rule` mangles.
fn immediate_case(s: u64, rule: Rule) -> Sim {
    let mut sim = sim_with_hostile(s, rule);
    // Node 0 talks to node 2 first so that connection exists before the attack.
    sim.put(0, 2, 800, 100);
    assert!(sim.wait_send(0, 800, 1_000_000).is_ok(), "seed {s}");
    let sink = Arc::new(Buffer::new(500));
    sim.nodes[0].lnet.post_sink(1, vec![Frag::whole(sink.clone())], 500);
    let (a, b) = (nid(1), nid(0));
    let msg = put_send(a, b, 1, 500);
    sim.nodes[1].engine.send(sim.now, msg).unwrap();
    assert_only_the_hostile_connection_closed(&mut sim, s);
    sim.gather();
    assert!(!sim.recvs.contains_key(&(0, 1)), "seed {s}: the mangled message was not delivered");
    assert!(sink.to_vec(0, 500).unwrap().iter().all(|&x| x == 0), "seed {s}: sink untouched");
    sim
}

#[test]
fn wrong_magic_closes_only_that_connection() {
    let s = seed();
    let sim = immediate_case(s, on_type(MsgType::Immediate, |m| m[0] ^= 0xff));
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
}

#[test]
fn wrong_version_closes_only_that_connection() {
    let sim = immediate_case(seed(), on_type(MsgType::Immediate, |m| m[4] = 0x77));
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
}

#[test]
fn lying_lengths_close_only_that_connection() {
    // nob larger than what arrived, and nob smaller than the header.
    let sim = immediate_case(
        seed(),
        on_type(MsgType::Immediate, |m| m[8..12].copy_from_slice(&4096u32.to_le_bytes())),
    );
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
    let sim = immediate_case(
        seed() + 1,
        on_type(MsgType::Immediate, |m| m[8..12].copy_from_slice(&20u32.to_le_bytes())),
    );
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
}

#[test]
fn wrong_source_nid_is_stale_and_closes_only_that_connection() {
    let sim = immediate_case(seed(), on_type(MsgType::Immediate, |m| m[16] ^= 1));
    assert!(sim.nodes[0].engine.stats().stale_msgs >= 1);
}

#[test]
fn wrong_destination_nid_is_stale_and_closes_only_that_connection() {
    let sim = immediate_case(seed(), on_type(MsgType::Immediate, |m| m[32] ^= 1));
    assert!(sim.nodes[0].engine.stats().stale_msgs >= 1);
}

#[test]
fn wrong_stamps_are_stale_and_close_only_that_connection() {
    let sim = immediate_case(seed(), on_type(MsgType::Immediate, |m| m[24] ^= 1));
    assert!(sim.nodes[0].engine.stats().stale_msgs >= 1);
    let sim = immediate_case(seed() + 1, on_type(MsgType::Immediate, |m| m[40] ^= 1));
    assert!(sim.nodes[0].engine.stats().stale_msgs >= 1);
}

#[test]
fn credit_overflow_closes_only_that_connection() {
    let sim = immediate_case(seed(), on_type(MsgType::Immediate, |m| m[7] = 200));
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
}

#[test]
fn a_garbled_lnet_header_closes_only_that_connection() {
    // The LNet message type inside the IMMEDIATE (bytes 48+24..) becomes unknown.
    let sim = immediate_case(
        seed(),
        on_type(MsgType::Immediate, |m| m[48 + 24..48 + 28].copy_from_slice(&99u32.to_le_bytes())),
    );
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
}

/// Node 0 PUTs 256 KiB to node 1, whose PUT_ACK `rule` mangles.
fn put_ack_case(s: u64, rule: Rule) -> Sim {
    let mut sim = sim_with_hostile(s, rule);
    sim.put(0, 2, 800, 100);
    assert!(sim.wait_send(0, 800, 1_000_000).is_ok(), "seed {s}");
    sim.put(0, 1, 1, 256 << 10);
    let r = sim.wait_send(0, 1, 2_000_000);
    assert!(r.is_err(), "seed {s}: the PUT fails: {r:?}");
    assert_only_the_hostile_connection_closed(&mut sim, s);
    sim.gather();
    assert_eq!(sim.sends[&(0, 1)].0, 1, "seed {s}: completed exactly once");
    sim
}

#[test]
fn an_unknown_cookie_closes_only_that_connection() {
    // PUT_ACK's src_cookie (body offset 0 = byte 48) no longer names the PUT_REQ.
    let sim = put_ack_case(seed(), on_type(MsgType::PutAck, |m| m[48] ^= 0x10));
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
}

#[test]
fn a_descriptor_pointing_outside_the_sink_writes_nothing() {
    // PUT_ACK's first fragment address (48 + 16 cookies + 8 key/nfrags + 4 nob = byte 76)
    // moves past the end of the sink: the sink's device refuses the RDMA WRITE.
    let s = seed();
    let mut sim = put_ack_case(
        s,
        on_type(MsgType::PutAck, |m| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&m[76..84]);
            let addr = u64::from_le_bytes(a) + (256 << 10);
            m[76..84].copy_from_slice(&addr.to_le_bytes());
        }),
    );
    let st = sim.nodes[1].engine.device().stats();
    assert!(st.access_errors >= 1, "seed {s}: the WRITE was refused by protection: {st:?}");
    sim.gather();
    assert!(!sim.recvs.contains_key(&(1, 1)) || sim.recvs[&(1, 1)].1.is_err(), "seed {s}");
}

#[test]
fn an_unexpected_message_type_closes_only_that_connection() {
    // A CONNACK type on an established connection.
    let sim = immediate_case(seed(), on_type(MsgType::Immediate, |m| m[6] = MsgType::ConnAck.as_u8()));
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1);
    let _ = Errno::EPROTO;
}

#[test]
fn a_get_done_claiming_more_than_the_sink_fails_the_get_with_eproto() {
    // GET_DONE's status (48 + 8 cookie = byte 56) claims a million bytes for a 1000-byte sink.
    // The message is well formed, so the connection stays; the GET fails and is counted.
    let s = seed();
    let mut sim = sim_with_hostile(
        s,
        on_type(MsgType::GetDone, |m| m[56..60].copy_from_slice(&1_000_000i32.to_le_bytes())),
    );
    let sink = get_from_node_1(&mut sim, 3, 1000);
    let r = sim.wait_send(0, 3, 1_000_000);
    assert_eq!(
        r.map_err(|e| e.errno),
        Err(Errno::EPROTO),
        "seed {s}: the GET fails, no reply_len past the sink"
    );
    assert_eq!(sim.nodes[0].engine.stats().protocol_errors, 1, "seed {s}");
    // The bytes the peer wrote are its own business (inside the sink); nothing else changed.
    assert_eq!(sink.to_vec(0, 1000).unwrap(), filled(3, 1000).to_vec(0, 1000).unwrap(), "seed {s}");
    sim.gather();
    assert_eq!(sim.sends[&(0, 3)].0, 1, "seed {s}: completed exactly once");
}

/// Node 1's first RTU is lost, so node 0 holds node 1's first messages as early receives until
/// the first of them stands for the RTU (here both complete in one CQ poll, before the CM has
/// heard of it). That first one carries an impossible credit count,
/// which closes the connection as soon as it is handled. Nothing may be queued on the closed
/// connection: a PUT_ACK for the PUT_REQ behind it waited there, holding a descriptor, until
/// its deadline 50 s later, then failed LNet's receive with ETIMEDOUT.
#[test]
fn early_receives_after_one_closed_the_connection_are_dropped_with_it() {
    let s = seed();
    let mut sim = sim_with_hostile_dropping_rtus(s, on_type(MsgType::Immediate, |m| m[7] = 200), 1);
    sim.put(1, 0, 1, 500);
    sim.put(1, 0, 2, 70_000);
    // Node 0 stops polling once it has sent its REP (node 1 is established), so that both
    // messages complete on its CQ in one poll, before the CM hears that they stand for the RTU.
    let up = sim.run_until(1_000_000, |sim| sim.nodes[1].engine.stats().conns_established > 0);
    assert!(up, "seed {s}");
    for _ in 0..200 {
        let now = sim.now;
        sim.nodes[1].engine.poll(now);
        let next = sim.nodes[1].engine.next_deadline().unwrap_or(now + Duration::from_micros(10));
        sim.now = next.max(now + Duration::from_micros(1)).min(now + Duration::from_micros(50));
    }
    let closed = sim.run_until(5_000_000, |sim| sim.nodes[0].engine.stats().protocol_errors > 0);
    assert!(closed, "seed {s}: the bad message closed the connection");
    assert_eq!(
        sim.nodes[0].engine.tx_descriptors().0,
        0,
        "seed {s}: nothing queued on the closed connection"
    );
    sim.run_for(Duration::from_secs(60));
    sim.gather();
    // The PUT either never reached LNet (it was an early receive behind the bad one) or it was
    // still on the CQ when the close reaped it, and its receive ended with the close's error.
    if let Some(&(n, r)) = sim.recvs.get(&(0, 2)) {
        assert_eq!((n, r.map_err(|e| e.errno)), (1, Err(Errno::EPROTO)), "seed {s}");
    }
    assert_eq!(sim.nodes[0].engine.stats().tx_timeouts, 0, "seed {s}: nothing waited for its deadline");
}

/// Every RTU of node 1 is lost. Node 1 is established (it sent the RTU) and its IMMEDIATE is
/// acknowledged by node 0's QP, so its LNet is told "sent": node 0 must deliver it. The first
/// receive on the accepting connection stands for the RTU, as IB's COMM_EST does; without that
/// the accept failed when the REP retries ran out and the message was dropped with it.
#[test]
fn a_message_that_arrives_instead_of_the_rtu_establishes_the_connection() {
    let s = seed();
    let mut sim = sim_with_hostile_dropping_rtus(s, Box::new(|_: &mut Vec<u8>| false), u32::MAX);
    let sink = sim.put(1, 0, 1, 500);
    assert!(sim.wait_send(1, 1, 1_000_000).is_ok(), "seed {s}");
    let delivered = sim.run_until(1_000_000, |sim| {
        sim.gather();
        sim.recvs.contains_key(&(0, 1))
    });
    assert!(delivered, "seed {s}: the sender was told 'sent', the receiver must have it");
    assert_eq!(sim.recvs[&(0, 1)], (1, Ok(500)), "seed {s}");
    assert_eq!(sink.to_vec(0, 500).unwrap(), filled(1, 500).to_vec(0, 500).unwrap(), "seed {s}");
    // And the connection stays up both ways.
    sim.run_for(Duration::from_secs(30));
    assert_eq!(sim.nodes[0].engine.conn_details(nid(1)).len(), 1, "seed {s}");
    let back = sim.put(0, 1, 2, 3000);
    assert!(sim.wait_send(0, 2, 1_000_000).is_ok(), "seed {s}");
    assert_eq!(back.to_vec(0, 3000).unwrap(), filled(2, 3000).to_vec(0, 3000).unwrap(), "seed {s}");
}

/// The peer's GET_DONE arrives as a NOOP (type 0xd0, header only, its credits kept), so the
/// GET_REQ, acknowledged and waiting for its completion, never hears back: it expires at its
/// deadline (`timeout`), once, with ETIMEDOUT, and its connection closes (o2iblnd: an expired
/// transmit closes the connection). Other transmits come and go meanwhile; none of them moves
/// the expiry, and a connection made afterwards works.
#[test]
fn a_get_whose_done_never_comes_expires_once_at_its_deadline() {
    let s = seed();
    let mut sim = sim_with_hostile(
        s,
        on_type(MsgType::GetDone, |m| {
            m.truncate(crate::wire::MSG_HDR_SIZE);
            m[6] = MsgType::Noop.as_u8();
            m[8..12].copy_from_slice(&(crate::wire::MSG_HDR_SIZE as u32).to_le_bytes());
        }),
    );
    let t0 = sim.now;
    get_from_node_1(&mut sim, 3, 1000);
    // Short-lived transmits on the same connection, before and while the GET waits.
    for tag in 10..20 {
        sim.put(0, 1, tag, 100);
        assert!(sim.wait_send(0, tag, 1_000_000).is_ok(), "seed {s}");
    }
    let r = sim.wait_send(0, 3, 10_000_000).map_err(|e| (e.errno, e.health));
    let took = sim.now.saturating_duration_since(t0);
    let timeout = tunables().tx_timeout();
    assert_eq!(r, Err((Errno::ETIMEDOUT, Health::RemoteTimeout)), "seed {s}");
    assert!(took >= timeout && took <= timeout + Duration::from_secs(1), "seed {s}: expired after {took:?}");
    assert_eq!(sim.nodes[0].engine.stats().tx_timeouts, 1, "seed {s}");
    sim.run_for(3 * timeout);
    sim.gather();
    assert_eq!(sim.sends[&(0, 3)].0, 1, "seed {s}: completed exactly once");
    assert_eq!(sim.nodes[0].engine.stats().tx_timeouts, 1, "seed {s}: expired once");
    assert_eq!(sim.nodes[0].engine.tx_descriptors().0, 0, "seed {s}: no descriptor held");
    // The connection closed with it; a new one carries traffic.
    sim.put(0, 1, 30, 100);
    assert!(sim.wait_send(0, 30, 1_000_000).is_ok(), "seed {s}");
}

/// Node 1's PUT_REQ says, in its LNet header (type at body byte 24), that it is a GET. Node 0's
/// LNet takes such a header as a GET it answers from a source, holding an MD for it: the
/// engine must end that receive (and NAK the PUT_REQ), not leave it held for good.
#[test]
fn a_put_req_carrying_a_get_header_ends_the_receive_lnet_accepted() {
    let s = seed();
    let mut sim = sim_with_hostile(
        s,
        on_type(MsgType::PutReq, |m| m[48 + 24..48 + 28].copy_from_slice(&2u32.to_le_bytes())),
    );
    let len = 256 << 10;
    // What node 0's LNet matches the rewritten header with.
    sim.nodes[0].lnet.post_source(1, vec![Frag::whole(filled(1, len))]);
    let sink = sim.put(1, 0, 1, len);
    let r = sim.wait_send(1, 1, 2_000_000).map_err(|e| e.errno);
    assert_eq!(r, Err(Errno::ENODATA), "seed {s}: the PUT is NAKed");
    sim.run_for(Duration::from_millis(100));
    sim.gather();
    let recv = sim.recvs.get(&(0, 1)).map(|(n, r)| (*n, r.as_ref().map_err(|e| e.errno).copied()));
    assert_eq!(recv, Some((1, Err(Errno::EINVAL))), "seed {s}: the receive ended once");
    assert_eq!(sim.sends[&(1, 1)].0, 1, "seed {s}: the PUT completed exactly once");
    assert!(sink.to_vec(0, len).unwrap().iter().all(|&x| x == 0), "seed {s}: nothing written");
    // A well-formed message: the connection stays and carries the next PUT.
    assert_eq!(sim.nodes[0].engine.conn_details(nid(1)).len(), 1, "seed {s}");
    sim.put(1, 0, 2, 100);
    assert!(sim.wait_send(1, 2, 1_000_000).is_ok(), "seed {s}");
}

/// Node 1's first PUT_ACK names (by its cookie, +16: cookies step by 2) node 0's ninth PUT_REQ,
/// which still waits in the reserved queue (Q = 8): it never reached node 1. The answer must
/// be refused as unmatched (o2iblnd looks only at the active transmits). Before, it turned the
/// queued PUT_REQ into a PUT_DONE, wrote PUT 9's payload into PUT 1's sink, reported PUT 9 as
/// delivered and left the transmit in two queues.
#[test]
fn a_put_ack_naming_a_put_req_not_yet_sent_closes_the_connection() {
    let s = seed();
    let mut sim = sim_with_hostile(
        s,
        on_type(MsgType::PutAck, |m| {
            let mut c = [0u8; 8];
            c.copy_from_slice(&m[48..56]);
            m[48..56].copy_from_slice(&(u64::from_le_bytes(c) + 16).to_le_bytes());
        }),
    );
    sim.put(0, 2, 800, 100);
    assert!(sim.wait_send(0, 800, 1_000_000).is_ok(), "seed {s}");
    let sinks: Vec<_> = (1..=9u64).map(|tag| sim.put(0, 1, tag, 64 << 10)).collect();
    let ok = sim.run_until(2_000_000, |sim| {
        check_credit_invariant(sim);
        sim.gather();
        (1..=9).all(|t| sim.sends.contains_key(&(0, t)))
    });
    assert!(ok, "seed {s}: every PUT completed");
    sim.run_for(Duration::from_millis(100));
    sim.gather();
    for tag in 1..=9u64 {
        let (n, r) = &sim.sends[&(0, tag)];
        assert_eq!(*n, 1, "seed {s}: PUT {tag} completed exactly once");
        // Only a PUT whose sink really got its bytes may succeed.
        if r.is_ok() {
            let got = sinks[tag as usize - 1].to_vec(0, 64 << 10).unwrap();
            assert!(got == filled(tag, 64 << 10).to_vec(0, 64 << 10).unwrap(), "seed {s}: PUT {tag}");
        }
    }
    assert!(sim.sends[&(0, 9)].1.is_err(), "seed {s}: PUT 9 never reached node 1");
    assert!(sim.nodes[0].engine.stats().protocol_errors >= 1, "seed {s}: the stray PUT_ACK was counted");
    assert_only_the_hostile_connection_closed(&mut sim, s);
}

/// Node 0 connects to node 1, whose REP carries a message that is not a CONNACK: node 0
/// rejects the REP and fails its PUT with `-EPROTO`. Node 1, which had accepted, hears the REJ
/// of its REP: as o2iblnd's `IBLND_CONN_PASSIVE_WAIT` case, that is a reset, not a refusal,
/// and the PUT node 1 queued on the accepting connection fails once with `-ECONNRESET`
/// instead of waiting for its deadline. Neither side retries on its own; the next send
/// connects.
#[test]
fn a_rejected_rep_resets_the_accepting_side() {
    let s = seed();
    const REP_CONNACK_TYPE: usize = crate::cm::mad::MAD_HEADER_LEN + 36 + 6;
    let mut sim = sim_with_hostile_rep(
        s,
        Box::new(|mad: &mut Vec<u8>| {
            mad[REP_CONNACK_TYPE] = MsgType::Noop.as_u8();
            true
        }),
    );
    sim.put(0, 1, 1, 100);
    let accepting = sim.run_until(100_000, |sim| {
        sim.nodes[1].engine.peers().iter().any(|p| p.nid == nid(0) && p.state == PeerState::Connecting)
    });
    assert!(accepting, "seed {s}: node 1 took node 0's REQ");
    sim.put(1, 0, 2, 100);
    assert_eq!(sim.wait_send(0, 1, 1_000_000).map_err(|e| e.errno), Err(Errno::EPROTO), "seed {s}");
    assert_eq!(sim.wait_send(1, 2, 1_000_000).map_err(|e| e.errno), Err(Errno::ECONNRESET), "seed {s}");
    let (st0, st1) = (sim.nodes[0].engine.stats(), sim.nodes[1].engine.stats());
    assert_eq!((st0.protocol_errors, st1.accepts_reset, st1.connects_rejected), (1, 1, 0), "seed {s}");
    assert_eq!(st0.tx_timeouts + st1.tx_timeouts, 0, "seed {s}: nothing waited for its deadline");
    // Both sides are idle, not retrying; a new send from either end connects.
    sim.run_for(Duration::from_secs(5));
    assert_eq!(sim.nodes[1].engine.stats().conns_established, 0, "seed {s}");
    sim.put(1, 0, 3, 100);
    assert!(sim.wait_send(1, 3, 1_000_000).is_ok(), "seed {s}");
    sim.gather();
    assert_eq!(sim.sends[&(0, 1)].0, 1, "seed {s}: completed exactly once");
    assert_eq!(sim.sends[&(1, 2)].0, 1, "seed {s}: completed exactly once");
}
