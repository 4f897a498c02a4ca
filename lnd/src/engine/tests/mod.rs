//! Deterministic simulations of engines on the simulated wire (seeded, virtual clock).
//!
//! `LND_SIM_SEED=<n>` replays a run; every failure message names the seed.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lnet_shim::buffer::Buffer;
use lnet_shim::hdr::{GetMsg, LnetHdr, LnetMsg, PutMsg, WireHandle};
use lnet_shim::lnd::{Frag, Frags, LndError, LndSend, LndUpcalls, RecvDisposition, SendStatus};
use lnet_shim::nid::{Nid, ProcessId};

use super::{Engine, EngineConfig};
use crate::fabric::Device;
use crate::fabric::soft::{CopyHelper, DirFaults, FaultConfig, SimNet, SingleCopy, SoftConfig, SoftDevice};
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
}

impl LndUpcalls for TestLnet {
    fn recv(&self, _from: Nid, hdr: &LnetHdr, _rdma: bool) -> RecvDisposition {
        let mut inner = self.inner.lock().unwrap();
        match hdr.msg {
            LnetMsg::Put(p) => match inner.sinks.remove(&p.match_bits) {
                Some((frags, cap)) => RecvDisposition::Sink {
                    frags: frags.into(),
                    mlength: (hdr.payload_length as usize).min(cap),
                    token: p.match_bits,
                },
                None => {
                    inner.dropped += 1;
                    RecvDisposition::Drop
                }
            },
            LnetMsg::Get(g) => match inner.sources.remove(&g.match_bits) {
                Some(frags) => RecvDisposition::Source { frags: frags.into(), token: g.match_bits },
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
    /// Completions gathered by [`Sim::gather`]: (node, token) → how many times, last result.
    pub(crate) sends: HashMap<(usize, u64), (u32, Result<SendStatus, LndError>)>,
    pub(crate) recvs: HashMap<(usize, u64), (u32, Result<usize, LndError>)>,
    /// `Some(window)`: the engines reap CQs as the driver has them do ([`Sim::reap_like_the_driver`]).
    spin: Option<Duration>,
    /// When each node's engine last did something (for `spin`).
    last_work: Vec<Instant>,
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

/// The default tunables with the most transport retries a QP can have (`retry_count=7`, 3
/// bits), for lossy tests that must lose nothing: with o2iblnd's 5, a QP legitimately gives up
/// (`RETRY_EXC_ERR`) now and then at 10-20% loss.
pub(crate) fn tunables_with_most_retries() -> Tunables {
    let mut t = Tunables { retry_count: 7, ..Tunables::default() };
    t.finalize().unwrap();
    t
}

impl Sim {
    pub(crate) fn new(seed: u64, n: usize, tun: &Tunables, faults: FaultConfig) -> Sim {
        let net = SimNet::new(seed, Duration::from_micros(5)).with_jitter(Duration::from_micros(2));
        let mut sim = Sim {
            net,
            nodes: Vec::new(),
            now: Instant::from_secs(1),
            seed,
            steps: 0,
            sends: HashMap::new(),
            recvs: HashMap::new(),
            spin: None,
            last_work: Vec::new(),
        };
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
        self.add_node_with(i, tun, faults, soft, incarnation, |_| {});
    }

    /// Adds (or replaces: a restart) node `i`, letting `tweak` adjust its engine configuration.
    pub(crate) fn add_node_with(
        &mut self,
        i: usize,
        tun: Tunables,
        faults: FaultConfig,
        soft: SoftConfig,
        incarnation: u64,
        tweak: impl FnOnce(&mut EngineConfig),
    ) {
        let dev = SoftDevice::open_sim(
            &self.net,
            ip(i),
            SoftConfig { faults, seed: self.seed ^ (i as u64).wrapping_mul(0x9e37) ^ incarnation, ..soft },
        );
        let lnet = Arc::new(TestLnet::default());
        let mut cfg = EngineConfig::new(
            nid(i),
            tun,
            incarnation,
            self.seed.wrapping_add(i as u64 * 7919) ^ incarnation,
        );
        tweak(&mut cfg);
        let mut engine = Engine::new(dev, cfg, lnet.clone()).unwrap();
        match self.spin {
            None => engine.set_poll_all_cqs(true),
            Some(window) => engine.set_cq_poll_window(window),
        }
        let node = Node { engine, lnet, nid: nid(i) };
        if i < self.nodes.len() {
            self.nodes[i] = node;
        } else {
            self.nodes.push(node);
            self.last_work.push(self.now);
        }
    }

    /// From now on the engines reap their CQs as under the driver: only the CQs whose fds
    /// would fire (the device's signalled ones), or, within `window` of their last completion,
    /// polled on every turn; and an engine idle for `window` arms its CQs before time moves on
    /// (the driver spins for `busy_poll_usec`, then arms and sleeps). A zero window is plain
    /// event mode. Applies to nodes added later too.
    pub(crate) fn reap_like_the_driver(&mut self, window: Duration) {
        self.spin = Some(window);
        for n in &mut self.nodes {
            n.engine.set_poll_all_cqs(false);
            n.engine.set_cq_poll_window(window);
        }
    }

    /// One step: every engine polls at `now`, then time jumps to the earliest deadline.
    pub(crate) fn step(&mut self) -> bool {
        self.steps += 1;
        for (n, last) in self.nodes.iter_mut().zip(&mut self.last_work) {
            if n.engine.poll(self.now) {
                *last = self.now;
            }
            if let Err(e) = n.engine.check_attempt_counts() {
                panic!("seed {}: step {}: {e}", self.seed, self.steps);
            }
        }
        let mut next = self.nodes.iter().filter_map(|n| n.engine.next_deadline()).min();
        if let Some(window) = self.spin {
            // Each driver spins until `window` after its last work; one that would sleep
            // before `next` arms its CQs first (and does not sleep if that found work).
            let now = self.now;
            for (n, last) in self.nodes.iter_mut().zip(&self.last_work) {
                let sleeps = next.is_none_or(|t| t > now && t >= *last + window);
                if sleeps && n.engine.arm_cqs(now) {
                    next = Some(now);
                }
            }
        }
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

    /// Moves every node's completions into `sends`/`recvs`, counting repeats.
    pub(crate) fn gather(&mut self) {
        for (i, n) in self.nodes.iter().enumerate() {
            for (tag, r) in n.lnet.take_send_done() {
                let e = self.sends.entry((i, tag)).or_insert((0, r));
                e.0 += 1;
                e.1 = r;
            }
            for (tag, r) in n.lnet.take_recv_done() {
                let e = self.recvs.entry((i, tag)).or_insert((0, r));
                e.0 += 1;
                e.1 = r;
            }
        }
    }

    /// Runs until node `a` reported send `tag` (at most `max_steps`); its result.
    pub(crate) fn wait_send(&mut self, a: usize, tag: u64, max_steps: u64) -> Result<SendStatus, LndError> {
        let ok = self.run_until(max_steps, |sim| {
            sim.gather();
            sim.sends.contains_key(&(a, tag))
        });
        assert!(ok, "seed {}: send {tag} on node {a} never completed (now {:?})", self.seed, self.now);
        self.sends[&(a, tag)].1
    }

    /// Sends a PUT of `len` pattern bytes tagged `tag` from `a` to `b`, posting `b`'s sink.
    pub(crate) fn put(&mut self, a: usize, b: usize, tag: u64, len: usize) -> Arc<Buffer> {
        let sink = Arc::new(Buffer::new(len));
        self.put_into(a, b, tag, len, &sink, len);
        sink
    }

    /// [`Sim::put`] into `sink`, whose MD at `b` matches at most `cap` bytes.
    pub(crate) fn put_into(
        &mut self,
        a: usize,
        b: usize,
        tag: u64,
        len: usize,
        sink: &Arc<Buffer>,
        cap: usize,
    ) {
        let msg = self.put_msg(a, b, tag, len, sink, cap);
        self.nodes[a].engine.send(self.now, msg).unwrap();
    }

    /// The PUT [`Sim::put_into`] sends, not sent yet (its sink is posted at `b`).
    pub(crate) fn put_msg(
        &self,
        a: usize,
        b: usize,
        tag: u64,
        len: usize,
        sink: &Arc<Buffer>,
        cap: usize,
    ) -> LndSend {
        self.nodes[b].lnet.post_sink(tag, vec![Frag::whole(sink.clone())], cap);
        put_send(self.nodes[a].nid, self.nodes[b].nid, tag, len)
    }

    /// Runs for `d` of virtual time.
    pub(crate) fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            if !self.step() {
                // Nothing is scheduled: idle until the end.
                self.now = end;
            }
        }
        self.step();
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

/// A PUT of `len` pattern bytes tagged `tag` (its token too) from `from` to `to`; no sink is
/// posted for it.
pub(crate) fn put_send(from: Nid, to: Nid, tag: u64, len: usize) -> LndSend {
    LndSend {
        target: to,
        hdr: put_hdr(from, to, tag, len),
        payload: Frag::whole(filled(tag, len)).into(),
        get_sink: None,
        token: tag,
    }
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

mod admission;
mod connect;
mod early;
mod hostile;
mod link;
mod ports;
mod reaping;
mod reconnect;
mod sink_keys;
mod soak;

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
        payload: Frag::whole(data).into(),
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
        payload: Frag::whole(filled(9, len)).into(),
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
        payload: Frags::new(),
        get_sink: Some(Frag::whole(dst.clone()).into()),
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
    assert_write_path(&sim);
}

/// A PUT moved by RDMA into an MD that matched fewer bytes than it carries (LNet's
/// `TRUNCATE`): the sink's PUT_ACK describes only those, and only those move (o2iblnd sizes
/// the WRITEs from the PUT_ACK's descriptor). Before, the source planned the whole payload
/// into the shorter sink and failed the PUT with EINVAL.
#[test]
fn an_rdma_put_into_a_truncating_md_moves_what_the_md_matched() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    for (tag, len, cap) in [(1u64, 5000usize, 4096usize), (2, 64 << 10, 8 << 10), (3, 1 << 20, 1)] {
        // The MD is one byte larger than it matches: that byte must stay untouched.
        let sink = Arc::new(Buffer::new(cap + 1));
        sim.put_into(0, 1, tag, len, &sink, cap);
        let r = sim.wait_send(0, tag, 1_000_000);
        assert_eq!(r, Ok(SendStatus { reply_len: None }), "seed {s}: PUT of {len} into {cap}");
        sim.run_for(Duration::from_millis(1));
        sim.gather();
        let recv = sim.recvs.get(&(1, tag)).map(|(n, r)| (*n, r.as_ref().ok().copied()));
        assert_eq!(recv, Some((1, Some(cap))), "seed {s}: the sink got {cap} of {len} bytes, once");
        let got = sink.to_vec(0, cap + 1).unwrap();
        assert!(got[..cap].iter().enumerate().all(|(i, &x)| x == pattern_byte(tag, i)), "seed {s}");
        assert_eq!(got[cap], 0, "seed {s}: nothing past what the MD matched");
    }
}

/// What the LND registers an LNet buffer with: a PUT's source only for local access (a peer
/// holding its rkey, stale or guessed, cannot write into it), the sink its PUT_ACK names for
/// remote writes.
#[test]
fn rdma_sources_are_not_remotely_writable_and_sinks_are() {
    use crate::engine::send::{SINK_ACCESS, SOURCE_ACCESS};
    use crate::fabric::dma::cache_slot;
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    let len = 64 << 10;
    let (source, sink) = (filled(5, len), Arc::new(Buffer::new(len)));
    sim.nodes[1].lnet.post_sink(5, vec![Frag::whole(sink.clone())], len);
    let (a, b) = (nid(0), nid(1));
    let msg = LndSend {
        target: b,
        hdr: put_hdr(a, b, 5, len),
        payload: Frag::whole(source.clone()).into(),
        get_sink: None,
        token: 5,
    };
    sim.nodes[0].engine.send(sim.now, msg).unwrap();
    assert!(sim.wait_send(0, 5, 1_000_000).is_ok(), "seed {s}");
    let cached = |e: &Engine<SoftDevice>, buf: &Buffer, access| {
        buf.registration(cache_slot(e.owner, access), |_, _| Err(())).ok()
    };
    let e0 = &sim.nodes[0].engine;
    let src_keys = cached(e0, &source, SOURCE_ACCESS).expect("the source was registered for reading");
    assert!(cached(e0, &source, SINK_ACCESS).is_none(), "seed {s}: and for nothing else");
    assert!(!e0.device().remote_write_allowed(&e0.pd, src_keys.rkey, source.addr(), 1), "seed {s}");
    let e1 = &sim.nodes[1].engine;
    let sink_keys = cached(e1, &sink, SINK_ACCESS).expect("the sink was registered for remote writes");
    assert!(e1.device().remote_write_allowed(&e1.pd, sink_keys.rkey, sink.addr(), len as u64), "seed {s}");
}

/// Asserts, for every connected pair, that one side's credits plus the other side's owed
/// credits never exceed the queue depth (the rest is in flight), and that counters are sane.
pub(crate) fn check_credit_invariant(sim: &Sim) {
    for (i, a) in sim.nodes.iter().enumerate() {
        for (j, b) in sim.nodes.iter().enumerate() {
            if i == j {
                continue;
            }
            for ca in a.engine.conn_details(b.nid) {
                let c = ca.credits;
                assert!(
                    c.credits <= c.queue_depth && c.reserved <= c.queue_depth,
                    "seed {}: {c:?}",
                    sim.seed
                );
                assert!(c.noops_posted <= crate::credits::OOB_MSGS, "seed {}: {c:?}", sim.seed);
                for cb in b.engine.conn_details(a.nid).iter().filter(|cb| cb.local_qpn == ca.remote_qpn) {
                    assert_eq!(
                        cb.credits.queue_depth, c.queue_depth,
                        "seed {}: both ends agree on Q",
                        sim.seed
                    );
                    assert!(
                        c.credits + cb.credits.outstanding <= c.queue_depth,
                        "seed {}: credits {} + peer's owed {} > Q {} ({i}->{j})",
                        sim.seed,
                        c.credits,
                        cb.credits.outstanding,
                        c.queue_depth
                    );
                }
            }
        }
    }
}

/// Every connection has all its credits home and nothing in flight.
pub(crate) fn assert_credits_home(sim: &Sim) {
    for a in &sim.nodes {
        for b in &sim.nodes {
            for c in a.engine.conn_details(b.nid) {
                let k = c.credits;
                assert_eq!(
                    (k.credits, k.reserved, k.outstanding, k.nsends_posted, k.queued, c.active_txs),
                    (k.queue_depth, k.queue_depth, 0, 0, 0, 0),
                    "seed {}: {} -> {}: {k:?}",
                    sim.seed,
                    a.nid,
                    b.nid
                );
            }
        }
    }
}

#[derive(Debug)]
struct Transfer {
    sender: usize,
    sink_node: usize,
    sink: Arc<Buffer>,
    off: usize,
    len: usize,
    send_ok: Option<bool>,
    recv_ok: Option<bool>,
}

/// Random IMMEDIATE/PUT/GET traffic with every byte verified.
pub(crate) struct Workload {
    rng: Rng,
    next_tag: u64,
    live: HashMap<u64, Transfer>,
    pub(crate) issued: u64,
    pub(crate) verified: u64,
    /// Payload bytes compared against their pattern (in verified transfers).
    pub(crate) bytes_verified: u64,
    pub(crate) failed: u64,
    total: u64,
    window: usize,
    max_len: usize,
}

impl Workload {
    pub(crate) fn new(seed: u64, total: u64, window: usize, max_len: usize) -> Workload {
        Workload {
            rng: Rng::new(seed ^ 0x5eed),
            next_tag: 1,
            live: HashMap::new(),
            issued: 0,
            verified: 0,
            bytes_verified: 0,
            failed: 0,
            total,
            window,
            max_len,
        }
    }

    fn random_len(&mut self) -> usize {
        let r = self.rng.below(10);
        let len = match r {
            0 => 0,
            1..=3 => self.rng.below(4000) as usize,
            _ => {
                let bits = self.rng.range_inclusive(12, 20);
                (1usize << bits) + self.rng.below(1 << bits) as usize
            }
        };
        len.min(self.max_len)
    }

    /// Issues transfers until the window is full.
    pub(crate) fn issue(&mut self, sim: &mut Sim) {
        let n = sim.nodes.len();
        while self.issued < self.total && self.live.len() < self.window {
            let a = self.rng.below(n as u64) as usize;
            let mut b = self.rng.below(n as u64 - 1) as usize;
            if b >= a {
                b += 1;
            }
            let tag = self.next_tag;
            self.next_tag += 1;
            let len = self.random_len();
            let off = self.rng.below(4096) as usize;
            let is_get = self.rng.chance(0.35);
            // The data lives (unaligned) in a bigger buffer, split into fragments.
            let data_off = self.rng.below(4096) as usize;
            let data = {
                let v: Vec<u8> = (0..data_off + len)
                    .map(|i| if i >= data_off { pattern_byte(tag, i - data_off) } else { 0 })
                    .collect();
                Arc::new(Buffer::from_slice(&v))
            };
            let pieces = self.rng.range_inclusive(1, 6) as usize;
            let src_frags = split(&data, data_off, len, pieces, &mut self.rng);
            let sink = Arc::new(Buffer::new(off + len + self.rng.below(64) as usize));
            let sink_frags = split(&sink, off, len, self.rng.range_inclusive(1, 3) as usize, &mut self.rng);
            let (from, to) = (sim.nodes[a].nid, sim.nodes[b].nid);
            let now = sim.now;
            let (sink_node, msg) = if is_get {
                // a GETs from b: b's data is the source, a's buffer the sink.
                sim.nodes[b].lnet.post_source(tag, src_frags);
                let msg = LndSend {
                    target: to,
                    hdr: get_hdr(from, to, tag, len),
                    payload: Frags::new(),
                    get_sink: Some(sink_frags.into()),
                    token: tag,
                };
                (a, msg)
            } else {
                sim.nodes[b].lnet.post_sink(tag, sink_frags, len);
                let msg = LndSend {
                    target: to,
                    hdr: put_hdr(from, to, tag, len),
                    payload: src_frags.into(),
                    get_sink: None,
                    token: tag,
                };
                (b, msg)
            };
            let small_get = false;
            sim.nodes[a].engine.send(now, msg).unwrap();
            self.issued += 1;
            self.live
                .insert(tag, Transfer { sender: a, sink_node, sink, off, len, send_ok: None, recv_ok: None });
            if small_get {
                // A GET small enough to travel IMMEDIATE carries no RDMA reply (LNet would send
                // a REPLY message); the source side reports its receive with 0 bytes moved.
                if let Some(t) = self.live.get_mut(&tag) {
                    t.len = 0;
                }
            }
        }
    }

    /// Collects completions; verifies finished transfers.
    pub(crate) fn collect(&mut self, sim: &mut Sim) {
        for (i, node) in sim.nodes.iter().enumerate() {
            for (tag, r) in node.lnet.take_send_done() {
                let t = self
                    .live
                    .get_mut(&tag)
                    .unwrap_or_else(|| panic!("seed {}: send_done for unknown {tag}", sim.seed));
                assert_eq!(t.sender, i, "seed {}", sim.seed);
                assert!(t.send_ok.is_none(), "seed {}: send {tag} completed twice", sim.seed);
                t.send_ok = Some(r.is_ok());
            }
            for (tag, r) in node.lnet.take_recv_done() {
                let t = self
                    .live
                    .get_mut(&tag)
                    .unwrap_or_else(|| panic!("seed {}: recv_done for unknown {tag}", sim.seed));
                assert!(t.recv_ok.is_none(), "seed {}: receive {tag} completed twice", sim.seed);
                if r.is_ok() && t.len > 0 {
                    assert_eq!(r, Ok(t.len), "seed {}: transfer {tag}", sim.seed);
                }
                t.recv_ok = Some(r.is_ok());
            }
        }
        let done: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, t)| t.send_ok.is_some() && t.recv_ok.is_some())
            .map(|(k, _)| *k)
            .collect();
        for tag in done {
            let Some(t) = self.live.remove(&tag) else { continue };
            if t.send_ok == Some(true) && t.recv_ok == Some(true) {
                let got = t.sink.to_vec(t.off, t.len).unwrap();
                if let Some(i) = got.iter().enumerate().position(|(i, &x)| x != pattern_byte(tag, i)) {
                    panic!(
                        "seed {}: transfer {tag} ({} bytes to node {}) corrupt at byte {i}",
                        sim.seed, t.len, t.sink_node
                    );
                }
                self.verified += 1;
                self.bytes_verified += t.len as u64;
            } else {
                self.failed += 1;
            }
        }
    }

    /// With every engine idle, a transfer whose send failed and whose receiver never heard of
    /// it is over: the message died with its connection before the receiver parsed it (LNet
    /// learns of it from the failed send; the receiver has nothing to report).
    fn settle_unseen(&mut self) {
        let unseen: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, t)| t.send_ok == Some(false) && t.recv_ok.is_none())
            .map(|(k, _)| *k)
            .collect();
        for tag in unseen {
            self.live.remove(&tag);
            self.failed += 1;
        }
    }

    pub(crate) fn finished(&self) -> bool {
        self.issued == self.total && self.live.is_empty()
    }

    /// Runs the workload to the end, checking the credit invariant on every step.
    pub(crate) fn run(&mut self, sim: &mut Sim, max_steps: u64) {
        for _ in 0..max_steps {
            self.issue(sim);
            sim.step();
            self.collect(sim);
            check_credit_invariant(sim);
            if sim.nodes.iter().all(|n| n.engine.next_deadline().is_none()) {
                self.settle_unseen();
            }
            if self.finished() {
                return;
            }
        }
        panic!(
            "seed {}: workload stalled at {:?} (deadlines {:?}): issued {} verified {} failed {} live {:?}",
            sim.seed,
            sim.now,
            sim.nodes.iter().map(|n| n.engine.next_deadline()).collect::<Vec<_>>(),
            self.issued,
            self.verified,
            self.failed,
            self.live.iter().take(10).map(|(k, t)| (*k, t.send_ok, t.recv_ok)).collect::<Vec<_>>()
        );
    }
}

/// Asserts that the RDMA WRITEs took the path `LND_SOFT_SINGLE_COPY` chose (every simulated
/// device is on one host): placed with one copy by default, all on the wire with `=0`. A run
/// that should use the single-copy path and silently did not fails here.
pub(crate) fn assert_write_path(sim: &Sim) {
    let placed: u64 = sim.nodes.iter().map(|n| n.engine.device().stats().placed_writes).sum();
    let sent: u64 = sim.nodes.iter().map(|n| n.engine.device().stats().placed_sent).sum();
    match SingleCopy::from_env() {
        mode @ (SingleCopy::Auto | SingleCopy::Syscall) => {
            assert!(placed > 0 && sent > 0, "seed {}: the single-copy path was not taken", sim.seed);
            // LNet buffers are in the arena (when there is one): copied from its mapping, unless
            // LND_SOFT_SINGLE_COPY=syscall.
            let mapped: u64 = sim.nodes.iter().map(|n| n.engine.device().stats().placed_mapped).sum();
            let want =
                if mode == SingleCopy::Auto && lnet_shim::arena::arena().is_some() { placed } else { 0 };
            assert_eq!(mapped, want, "seed {}: copies from the mapped arena ({mode:?})", sim.seed);
        }
        SingleCopy::Off => {
            assert_eq!((placed, sent), (0, 0), "seed {}: WRITEs placed with LND_SOFT_SINGLE_COPY=0", sim.seed)
        }
    }
    // Copies left running on the copy engine: with `LND_SOFT_COPY_HELPER=always` every copy the
    // helper took part in ran on it while the device went on; otherwise none (on the virtual
    // clock `Auto` never leaves one running).
    let split: u64 = sim.nodes.iter().map(|n| n.engine.device().stats().placed_split).sum();
    let overlapped = copies_left_running(sim);
    let want = if CopyHelper::from_env() == CopyHelper::Always { split } else { 0 };
    assert_eq!(overlapped, want, "seed {}: copies left running ({} split)", sim.seed, split);
}

/// The copies the simulated devices left running on their copy engines.
fn copies_left_running(sim: &Sim) -> u64 {
    sim.nodes.iter().map(|n| n.engine.device().stats().placed_overlapped).sum()
}

/// With `LND_SOFT_COPY_HELPER=always` on the mapped path, a workload with WRITEs of 256 KiB
/// and more must have left copies running (CI runs the simulations so).
fn assert_copies_ran(sim: &Sim) {
    let mapped = SingleCopy::from_env() == SingleCopy::Auto && lnet_shim::arena::arena().is_some();
    if mapped && CopyHelper::from_env() == CopyHelper::Always {
        let n = copies_left_running(sim);
        assert!(n > 0, "seed {}: no copy was left running with LND_SOFT_COPY_HELPER=always", sim.seed);
        println!("{n} copies left running on the copy engines");
    }
}

/// Lets keepalives return every owed credit, then checks credits and descriptors are home.
pub(crate) fn settle_and_check(sim: &mut Sim) {
    sim.run_for(Duration::from_secs(2 * u64::from(tunables().keepalive) + 5));
    assert_credits_home(sim);
    for n in &sim.nodes {
        assert_eq!(n.engine.tx_descriptors().0, 0, "seed {}: descriptors leaked on {}", sim.seed, n.nid);
    }
}

#[test]
fn ten_thousand_mixed_transfers_between_two_engines_every_byte_verified() {
    let s = seed();
    let faults = FaultConfig {
        tx: crate::fabric::soft::DirFaults {
            drop: 0.01,
            reorder: 0.01,
            duplicate: 0.005,
            ..crate::fabric::soft::DirFaults::NONE
        },
        rx: crate::fabric::soft::DirFaults::NONE,
    };
    let mut sim = Sim::new(s, 2, &tunables(), faults);
    let mut w = Workload::new(s, 10_000, 24, 1 << 20);
    w.run(&mut sim, 20_000_000);
    assert_eq!((w.verified, w.failed), (10_000, 0), "seed {s}");
    assert_write_path(&sim);
    assert_copies_ran(&sim);
    settle_and_check(&mut sim);
}

#[test]
fn mixed_transfers_among_eight_engines_every_byte_verified() {
    let s = seed();
    let faults = FaultConfig {
        tx: crate::fabric::soft::DirFaults {
            drop: 0.01,
            reorder: 0.01,
            ..crate::fabric::soft::DirFaults::NONE
        },
        rx: crate::fabric::soft::DirFaults::NONE,
    };
    let mut sim = Sim::new(s, 8, &tunables(), faults);
    let mut w = Workload::new(s, 10_000, 48, 1 << 20);
    w.run(&mut sim, 20_000_000);
    assert_eq!((w.verified, w.failed), (10_000, 0), "seed {s}");
    assert_write_path(&sim);
    assert_copies_ran(&sim);
    settle_and_check(&mut sim);
}

/// Regression: the receiver of a message closes the connection right after receiving it (the
/// lnd-bench client shutting down after the last reply). Its ACK reaches the sender before its
/// DREQ, often in the same `progress` call; the send must complete as sent, not be aborted by
/// the disconnect because its completion was reaped after the DREQ was handled.
#[test]
fn a_send_acknowledged_just_before_the_peer_disconnects_completes_as_sent() {
    let base = seed();
    for k in 0..8u64 {
        let s = base.wrapping_add(k);
        let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
        let (a, b) = (nid(0), nid(1));
        // Connect first, so the message below is the only traffic in flight.
        sim.put(0, 1, 1, 8);
        assert!(sim.wait_send(0, 1, 10_000).is_ok(), "seed {s}");
        sim.nodes[1].lnet.take_recv_done();
        let sink = Arc::new(Buffer::new(16));
        sim.nodes[1].lnet.post_sink(2, vec![Frag::whole(sink)], 16);
        let msg = put_send(a, b, 2, 16);
        sim.nodes[0].engine.send(sim.now, msg).unwrap();
        assert!(
            sim.run_until(10_000, |sim| !sim.nodes[1].lnet.inner.lock().unwrap().recv_done.is_empty()),
            "seed {s}"
        );
        // The receiver hangs up at once, at the instant the message arrived: its DREQ leaves
        // right behind its ACK.
        let now = sim.now;
        sim.nodes[1].engine.close_peer(now, a);
        sim.nodes[1].engine.poll(now);
        // The sender next looks when both have arrived (it was busy, or asleep in epoll).
        sim.now = now + Duration::from_micros(50);
        sim.nodes[0].engine.poll(sim.now);
        let r = sim.wait_send(0, 2, 10_000);
        assert!(r.is_ok(), "seed {s}: the acknowledged send was reported as {r:?}");
    }
}

/// The sink of a PUT whose PUT_DONE arrived has its data, even when its own PUT_ACK's send
/// completion has not been seen yet (the RC ACK for it was lost) and the source disconnects
/// right after the PUT_DONE is acknowledged: the PUT_DONE proves the PUT_ACK was delivered,
/// so the flush of its send must not fail the receive. Many seeds under loss, each ending with
/// the source hanging up the instant its PUT completes.
#[test]
fn a_put_whose_put_done_arrived_succeeds_at_the_sink_when_the_source_hangs_up_at_once() {
    let base = seed();
    let loss = FaultConfig::symmetric(DirFaults::lossy(0.15));
    let mut sink_errors = Vec::new();
    for k in 0..150u64 {
        let s = base.wrapping_add(k);
        let mut sim = Sim::new(s, 2, &tunables(), loss);
        let b = nid(1);
        let sink = sim.put(0, 1, 1, 65536);
        let r = sim.wait_send(0, 1, 200_000);
        if r.is_err() {
            continue; // the loss broke the connection first: not this case
        }
        let now = sim.now;
        sim.nodes[0].engine.close_peer(now, b);
        sim.nodes[0].engine.poll(now);
        assert!(
            sim.run_until(200_000, |sim| {
                sim.gather();
                sim.recvs.contains_key(&(1, 1))
            }),
            "seed {s}: the sink never finished (at {:?})",
            sim.now
        );
        match sim.recvs[&(1, 1)] {
            (1, Ok(65536)) => {
                assert!(sink.to_vec(0, 65536) == filled(1, 65536).to_vec(0, 65536), "seed {s}: data")
            }
            other => sink_errors.push((s, other)),
        }
    }
    assert!(sink_errors.is_empty(), "sinks failed after their PUT_DONE arrived: {sink_errors:?}");
}

/// The driver takes LNet's sends between the two halves of a poll: a reply an upcall queued
/// while the first half reaped the request is transmitted by the second half of the same
/// turn, not a turn later (a ping's round trip was one scheduler turn longer per side).
#[test]
fn a_send_taken_between_the_halves_of_a_poll_leaves_in_that_turn() {
    let s = seed();
    let mut sim = Sim::new(s, 2, &tunables(), FaultConfig::NONE);
    sim.put(0, 1, 1, 8);
    assert!(sim.wait_send(0, 1, 10_000).is_ok(), "seed {s}");
    sim.run_for(Duration::from_millis(1));
    sim.nodes[1].lnet.take_recv_done();
    sim.put(0, 1, 2, 8);
    let mut arrived = None;
    for _ in 0..10_000 {
        let now = sim.now;
        sim.nodes[0].engine.poll(now);
        let turn = sim.nodes[1].engine.poll_completions(now);
        if !sim.nodes[1].lnet.take_recv_done().is_empty() {
            arrived = Some(turn);
            break;
        }
        sim.nodes[1].engine.poll_finish(now, turn);
        let next = sim.nodes.iter().filter_map(|n| n.engine.next_deadline()).min();
        sim.now = sim.now.max(next.expect("something is in flight"));
    }
    let turn = arrived.unwrap_or_else(|| panic!("seed {s}: the request never arrived"));
    // The reply, sent as an event callback's LNet put would be.
    sim.put(1, 0, 3, 8);
    let before = sim.nodes[1].engine.device().stats().tx_packets;
    sim.nodes[1].engine.poll_finish(sim.now, turn);
    let after = sim.nodes[1].engine.device().stats().tx_packets;
    assert_eq!(after, before + 1, "seed {s}: the reply's frame left in the turn that reaped the request");
    assert!(sim.wait_send(1, 3, 10_000).is_ok(), "seed {s}");
}
