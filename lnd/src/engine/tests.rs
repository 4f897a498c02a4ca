//! Deterministic simulations of engines on the simulated wire (seeded, virtual clock).
//!
//! `LND_SIM_SEED=<n>` replays a run; every failure message names the seed.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lnet_shim::buffer::Buffer;
use lnet_shim::hdr::{GetMsg, LnetHdr, LnetMsg, PutMsg, WireHandle};
use lnet_shim::lnd::{Frag, LndError, LndSend, LndUpcalls, RecvDisposition, SendStatus};
use lnet_shim::nid::{Nid, ProcessId};

use super::{Engine, EngineConfig};
use crate::fabric::Device;
use crate::fabric::soft::{FaultConfig, SimNet, SoftConfig, SoftDevice};
use crate::rng::Rng;
use crate::time::Instant;
use crate::tunables::Tunables;

pub(crate) fn seed() -> u64 {
    std::env::var("LND_SIM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x0be9_1b91)
}

/// A stand-in for LNet: sinks and sources posted by match bits, results recorded.
#[derive(Default)]
pub(crate) struct TestLnet {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    sinks: HashMap<u64, (Vec<Frag>, usize)>,
    sources: HashMap<u64, Vec<Frag>>,
    recv_done: Vec<(u64, Result<usize, LndError>)>,
    send_done: Vec<(u64, Result<SendStatus, LndError>)>,
    dropped: u64,
}

impl TestLnet {
    pub(crate) fn post_sink(&self, bits: u64, frags: Vec<Frag>, cap: usize) {
        self.inner.lock().unwrap().sinks.insert(bits, (frags, cap));
    }

    pub(crate) fn post_source(&self, bits: u64, frags: Vec<Frag>) {
        self.inner.lock().unwrap().sources.insert(bits, frags);
    }

    pub(crate) fn take_send_done(&self) -> Vec<(u64, Result<SendStatus, LndError>)> {
        std::mem::take(&mut self.inner.lock().unwrap().send_done)
    }

    pub(crate) fn take_recv_done(&self) -> Vec<(u64, Result<usize, LndError>)> {
        std::mem::take(&mut self.inner.lock().unwrap().recv_done)
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.inner.lock().unwrap().dropped
    }
}

impl LndUpcalls for TestLnet {
    fn recv(&self, _from: Nid, hdr: &LnetHdr, _rdma: bool) -> RecvDisposition {
        let mut inner = self.inner.lock().unwrap();
        match hdr.msg {
            LnetMsg::Put(p) => match inner.sinks.remove(&p.match_bits) {
                Some((frags, cap)) => RecvDisposition::Sink {
                    frags,
                    mlength: (hdr.payload_length as usize).min(cap),
                    token: p.match_bits,
                },
                None => {
                    inner.dropped += 1;
                    RecvDisposition::Drop
                }
            },
            LnetMsg::Get(g) => match inner.sources.remove(&g.match_bits) {
                Some(frags) => RecvDisposition::Source { frags, token: g.match_bits },
                None => {
                    inner.dropped += 1;
                    RecvDisposition::Drop
                }
            },
            _ => RecvDisposition::Drop,
        }
    }

    fn recv_done(&self, token: u64, result: Result<usize, LndError>) {
        self.inner.lock().unwrap().recv_done.push((token, result));
    }

    fn send_done(&self, token: u64, result: Result<SendStatus, LndError>) {
        self.inner.lock().unwrap().send_done.push((token, result));
    }
}

pub(crate) struct Node {
    pub(crate) engine: Engine<SoftDevice>,
    pub(crate) lnet: Arc<TestLnet>,
    pub(crate) nid: Nid,
}

pub(crate) struct Sim {
    pub(crate) net: SimNet,
    pub(crate) nodes: Vec<Node>,
    pub(crate) now: Instant,
    pub(crate) seed: u64,
    pub(crate) steps: u64,
}

pub(crate) fn ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250 + 1) as u8)
}

pub(crate) fn nid(i: usize) -> Nid {
    Nid::o2ib(ip(i))
}

pub(crate) fn tunables() -> Tunables {
    let mut t = Tunables::default();
    t.finalize().unwrap();
    t
}

impl Sim {
    pub(crate) fn new(seed: u64, n: usize, tun: &Tunables, faults: FaultConfig) -> Sim {
        let net = SimNet::new(seed, Duration::from_micros(5)).with_jitter(Duration::from_micros(2));
        let mut sim = Sim { net, nodes: Vec::new(), now: Instant::from_secs(1), seed, steps: 0 };
        for i in 0..n {
            sim.add_node(i, tun.clone(), faults, SoftConfig::default(), 1000 + i as u64);
        }
        sim
    }

    pub(crate) fn add_node(
        &mut self,
        i: usize,
        tun: Tunables,
        faults: FaultConfig,
        soft: SoftConfig,
        incarnation: u64,
    ) {
        let dev = SoftDevice::open_sim(
            &self.net,
            ip(i),
            SoftConfig { faults, seed: self.seed ^ (i as u64).wrapping_mul(0x9e37), ..soft },
        );
        let lnet = Arc::new(TestLnet::default());
        let cfg = EngineConfig::new(nid(i), tun, incarnation, self.seed.wrapping_add(i as u64 * 7919));
        let mut engine = Engine::new(dev, cfg, lnet.clone()).unwrap();
        engine.set_poll_all_cqs(true);
        let node = Node { engine, lnet, nid: nid(i) };
        if i < self.nodes.len() {
            self.nodes[i] = node;
        } else {
            self.nodes.push(node);
        }
    }

    /// One step: every engine polls at `now`, then time jumps to the earliest deadline.
    pub(crate) fn step(&mut self) -> bool {
        self.steps += 1;
        for n in &mut self.nodes {
            n.engine.poll(self.now);
        }
        let next = self.nodes.iter().filter_map(|n| n.engine.next_deadline()).min();
        match next {
            Some(t) => {
                self.now = self.now.max(t);
                true
            }
            None => false,
        }
    }

    /// Runs until `done` (checked after each step) or `max_steps`; false if it never held.
    pub(crate) fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&mut Sim) -> bool) -> bool {
        for _ in 0..max_steps {
            let more = self.step();
            if done(self) {
                return true;
            }
            if !more {
                return false;
            }
        }
        false
    }

    /// Runs for `d` of virtual time.
    pub(crate) fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
    }
}

pub(crate) fn pattern_byte(tag: u64, i: usize) -> u8 {
    let x =
        tag.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add((i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    (x >> 56) as u8 ^ (i as u8)
}

pub(crate) fn filled(tag: u64, len: usize) -> Arc<Buffer> {
    let v: Vec<u8> = (0..len).map(|i| pattern_byte(tag, i)).collect();
    Arc::new(Buffer::from_slice(&v))
}

pub(crate) fn put_hdr(from: Nid, to: Nid, bits: u64, len: usize) -> LnetHdr {
    LnetHdr {
        dest: ProcessId::new(to, ProcessId::PID_LUSTRE),
        src: ProcessId::new(from, ProcessId::PID_LUSTRE),
        payload_length: len as u32,
        msg: LnetMsg::Put(PutMsg {
            ack_wmd: WireHandle::NONE,
            match_bits: bits,
            hdr_data: 0,
            ptl_index: 4,
            offset: 0,
        }),
    }
}

pub(crate) fn get_hdr(from: Nid, to: Nid, bits: u64, len: usize) -> LnetHdr {
    LnetHdr {
        dest: ProcessId::new(to, ProcessId::PID_LUSTRE),
        src: ProcessId::new(from, ProcessId::PID_LUSTRE),
        payload_length: 0,
        msg: LnetMsg::Get(GetMsg {
            return_wmd: WireHandle::new(1, bits),
            match_bits: bits,
            ptl_index: 4,
            src_offset: 0,
            sink_length: len as u32,
        }),
    }
}

/// Splits `len` bytes of `buf` starting at `off` into up to `pieces` fragments.
pub(crate) fn split(buf: &Arc<Buffer>, off: usize, len: usize, pieces: usize, rng: &mut Rng) -> Vec<Frag> {
    let mut frags = Vec::new();
    let mut at = off;
    let mut left = len;
    for i in 0..pieces {
        if left == 0 {
            break;
        }
        let n = if i + 1 == pieces { left } else { (rng.below(left as u64 + 1) as usize).max(1).min(left) };
        frags.push(Frag { buf: buf.clone(), offset: at, len: n });
        at += n;
        left -= n;
    }
    frags
}

#[test]
fn two_engines_connect_and_exchange_an_immediate_put() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    let (a, b) = (nid(0), nid(1));
    let sink = Arc::new(Buffer::new(100));
    sim.nodes[1].lnet.post_sink(7, vec![Frag::whole(sink.clone())], 100);
    let data = filled(7, 100);
    let msg = LndSend {
        target: b,
        hdr: put_hdr(a, b, 7, 100),
        payload: vec![Frag::whole(data)],
        get_sink: None,
        token: 1,
    };
    sim.nodes[0].engine.send(sim.now, msg).unwrap();
    assert!(
        sim.run_until(10_000, |sim| !sim.nodes[1].lnet.inner.lock().unwrap().recv_done.is_empty()),
        "seed {s}"
    );
    assert!(
        sim.run_until(10_000, |sim| !sim.nodes[0].lnet.inner.lock().unwrap().send_done.is_empty()),
        "seed {s}"
    );
    let r = sim.nodes[1].lnet.take_recv_done();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, Ok(100));
    assert_eq!(sink.to_vec(0, 100).unwrap(), (0..100).map(|i| pattern_byte(7, i)).collect::<Vec<_>>());
    let sd = sim.nodes[0].lnet.take_send_done();
    assert_eq!(sd.len(), 1);
    assert!(sd[0].1.is_ok(), "{sd:?}");
}

#[test]
fn put_and_get_by_rdma_write() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    let (a, b) = (nid(0), nid(1));
    let len = 1 << 20;
    // PUT 1 MiB a -> b.
    let sink = Arc::new(Buffer::new(len));
    sim.nodes[1].lnet.post_sink(9, vec![Frag::whole(sink.clone())], len);
    let msg = LndSend {
        target: b,
        hdr: put_hdr(a, b, 9, len),
        payload: vec![Frag::whole(filled(9, len))],
        get_sink: None,
        token: 1,
    };
    sim.nodes[0].engine.send(sim.now, msg).unwrap();
    // GET 1 MiB from b into a.
    sim.nodes[1].lnet.post_source(11, vec![Frag::whole(filled(11, len))]);
    let dst = Arc::new(Buffer::new(len));
    let get = LndSend {
        target: b,
        hdr: get_hdr(a, b, 11, len),
        payload: vec![],
        get_sink: Some(vec![Frag::whole(dst.clone())]),
        token: 2,
    };
    sim.nodes[0].engine.send(sim.now, get).unwrap();
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    assert!(
        sim.run_until(100_000, |sim| {
            sends.extend(sim.nodes[0].lnet.take_send_done());
            recvs.extend(sim.nodes[1].lnet.take_recv_done());
            sends.len() == 2 && recvs.len() == 2
        }),
        "seed {s}: sends {sends:?} recvs {recvs:?}"
    );
    sends.sort_by_key(|x| x.0);
    assert_eq!(sends[0].1, Ok(SendStatus { reply_len: None }), "PUT");
    assert_eq!(sends[1].1, Ok(SendStatus { reply_len: Some(len) }), "GET");
    recvs.sort_by_key(|x| x.0);
    assert_eq!(recvs, vec![(9, Ok(len)), (11, Ok(len))]);
    assert!(sink.to_vec(0, len).unwrap().iter().enumerate().all(|(i, &x)| x == pattern_byte(9, i)));
    assert!(dst.to_vec(0, len).unwrap().iter().enumerate().all(|(i, &x)| x == pattern_byte(11, i)));
    assert!(sim.nodes[0].engine.stats().rdma_bytes >= len as u64);
    assert!(sim.nodes[1].engine.stats().rdma_bytes >= len as u64);
}
