//! `soft_device_rx`: the software device's receive path end to end
//! (`lnd::fabric::soft::SoftDevice`).
//!
//! Two devices, A (10.0.0.1) and B (10.0.0.2), sit on a [`SimNet`] with a live, connected RC
//! QP pair (as `lnd/src/fabric/soft/tests.rs` sets one up). Each device's wire is wrapped in a
//! [`TapWire`] through which the input injects datagrams, as if from the peer or from a
//! stranger, raw, with the ICRC recomputed so they get past the CRC check, or (from the peer)
//! unsealed, as through a same-host ring, so that no ICRC is checked; optionally aimed at
//! the live QP, its expected PSN and its registered memory, optionally coalesced as a GRO batch.
//! Between injections the input drives real traffic (SENDs, RDMA WRITEs, receives) and time.
//!
//! Checked:
//! * [`Device::progress`] never panics and never fails (the simulated wire cannot);
//! * **protection**: no byte outside a live registration with `REMOTE_WRITE` ever changes:
//!   each node's registered page has guard pages on both sides, and a second region registered
//!   without `REMOTE_WRITE` must keep its contents, whatever the peer or a stranger sends;
//! * completions name work requests that were posted.

use std::collections::VecDeque;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lnd::fabric::dma::{Buffer, RegisteredBuf};
use lnd::fabric::soft::packet::{
    BTH_LEN, DETH_LEN, IcrcMeta, Opcode, PSN_MASK, RETH_LEN, ROCEV2_UDP_PORT, psn_add,
};
use lnd::fabric::soft::wire::Received;
use lnd::fabric::soft::{SimNet, SimPort, SoftConfig, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp, Wire};
use lnd::fabric::{
    Access, CompletionQueue, Device, MemoryRegion, Mtu, PortAddr, QpCaps, QpInitAttr, QpModify, QueuePair,
    RecvWr, SendFlags, SendOp, SendWr, Sge, Wc,
};
use lnd::time::Instant;

use crate::Cursor;
use crate::roce_packet::reseal;

/// Size of a node's registered region (one page, between two guard pages).
pub const REGION: usize = 4096;
/// What the guard pages and the read-only region are filled with.
const GUARD_BYTE: u8 = 0xee;
const READ_ONLY_BYTE: u8 = 0x77;
/// Send-queue start PSNs: A's near the 2^24 wrap, B's near 0 (each is the peer's expected PSN).
pub const PSN: [u32; 2] = [0xff_fff0, 0x00_0005];
/// Work-request ids are below this.
const WR_ID_LIMIT: u64 = 1 << 32;
/// Steps of the final run-down (progress, then jump to the next deadline).
const RUN_DOWN_STEPS: usize = 200;

/// Injection control bits (the byte after an inject operation).
pub mod ctl {
    /// Inject into B (else A).
    pub const TO_B: u8 = 1 << 0;
    /// Claim to come from the peer's address (else from a stranger, 10.0.0.9).
    pub const FROM_PEER: u8 = 1 << 1;
    /// Aim at the live QP (else keep the frame's destination QPN).
    pub const AIM_QP: u8 = 1 << 2;
    /// Set the PSN to the receiver's initial expected PSN plus the signed next input byte.
    pub const AIM_PSN: u8 = 1 << 3;
    /// Point a RETH at the receiver's region: its rkey and an offset (next u16) around it.
    pub const AIM_MEMORY: u8 = 1 << 4;
    /// Recompute the ICRC after patching (else the frame's ICRC is kept, usually wrong). A
    /// single frame from the peer without it is delivered *unsealed*, as from a same-host ring
    /// (`Received::sealed` false): decoded without the ICRC check, so every mutation reaches
    /// the parser and the RC transport.
    pub const RESEAL: u8 = 1 << 5;
    /// Deliver the frame twice, coalesced as one GRO batch.
    pub const GRO: u8 = 1 << 6;
    /// Aim at the GSI (QP1) instead of the live QP.
    pub const AIM_GSI: u8 = 1 << 7;
}

/// Operations of the input language (first byte modulo [`Op::COUNT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// `flags len:u16 delta offset:u16 bytes[len % 4400]`: inject a datagram (see [`ctl`]
    /// for `flags`; `delta` is the signed PSN offset of [`ctl::AIM_PSN`], `offset` the memory
    /// offset of [`ctl::AIM_MEMORY`]), then run both devices.
    Inject = 0,
    /// `ms`: run both devices, then advance the clock by `ms * 50` µs.
    Progress = 1,
    /// Run both devices at the earliest deadline, a few times.
    RunToDeadline = 2,
    /// `side kind len:u16 offset:u16`: `side` posts a SEND, SEND with immediate, or RDMA WRITE
    /// to the peer's region.
    Post = 3,
    /// `side len`: `side` posts a receive into its region; completions are drained.
    PostRecv = 4,
}

impl Op {
    /// Number of operations (inject is given weight 3: values 5..=7 inject too).
    pub const COUNT: u8 = 8;
}

/// A datagram waiting in a [`TapWire`].
#[derive(Debug)]
struct Injected {
    src: Ipv4Addr,
    bytes: Vec<u8>,
    seg: usize,
    sealed: bool,
}

/// A wire that delivers injected datagrams before the simulated network's.
#[derive(Debug)]
pub struct TapWire {
    inner: SimPort,
    tap: Arc<Mutex<VecDeque<Injected>>>,
}

impl Wire for TapWire {
    fn local_ip(&self) -> Ipv4Addr {
        self.inner.local_ip()
    }

    fn udp_port(&self) -> u16 {
        self.inner.udp_port()
    }

    fn send(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()> {
        self.inner.send(now, dst, frame)
    }

    fn recv(&mut self, now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>> {
        let next = self.tap.lock().unwrap().pop_front();
        match next {
            Some(f) => {
                let len = f.bytes.len().min(buf.len());
                buf[..len].copy_from_slice(&f.bytes[..len]);
                let seg = if f.seg < len { f.seg } else { 0 };
                Ok(Some(Received {
                    src: f.src,
                    src_port: ROCEV2_UDP_PORT,
                    len,
                    seg,
                    sealed: f.sealed || seg > 0,
                }))
            }
            None => self.inner.recv(now, buf),
        }
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn next_deadline(&self) -> Option<Instant> {
        if self.tap.lock().unwrap().is_empty() { self.inner.next_deadline() } else { Some(Instant::ZERO) }
    }
}

/// One side: a device with a connected QP, a guarded region peers may write, and a region they
/// may not.
pub struct Node {
    // Field order is drop order: queue pair and regions go before the memory they cover.
    qp: SoftQp,
    mr: SoftMr,
    ro_mr: SoftMr,
    src: RegisteredBuf<SoftDevice>,
    cq: SoftCq,
    _pd: SoftPd,
    dev: SoftDevice,
    /// Guard page, registered page, guard page.
    mem: Buffer,
    /// Registered with LOCAL_WRITE only.
    ro_mem: Buffer,
    tap: Arc<Mutex<VecDeque<Injected>>>,
    ip: Ipv4Addr,
}

/// The address of side `n`.
pub fn ip(side: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, 1 + side as u8)
}

fn stranger() -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, 9)
}

impl Node {
    fn new(net: &SimNet, side: usize) -> Node {
        let tap = Arc::new(Mutex::new(VecDeque::new()));
        let wire = TapWire { inner: net.attach(ip(side)), tap: tap.clone() };
        let config = SoftConfig { seed: 0x5eed + side as u64, ..SoftConfig::default() };
        let dev = SoftDevice::with_wire(Box::new(wire), config);
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256).unwrap();
        let cap = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        };
        let qp = dev.create_qp(&pd, &cq, &cq, &QpInitAttr { cap, sq_sig_all: false }).unwrap();
        let mem = Buffer::new(3 * REGION);
        mem.fill(GUARD_BYTE);
        mem.fill_range(REGION, REGION, 0).unwrap();
        let rw = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
        // SAFETY: `mem` outlives `mr` (field order: `mr` drops first) and is only accessed by raw
        // copies (`Buffer::read`/`write`), never through references.
        let mr = unsafe { dev.reg_mr(&pd, mem.as_mut_ptr().add(REGION), REGION, rw) }.unwrap();
        let ro_mem = Buffer::new(REGION);
        ro_mem.fill(READ_ONLY_BYTE);
        // SAFETY: as for `mr`: `ro_mem` outlives `ro_mr` and is only accessed by raw copies.
        let ro_mr = unsafe { dev.reg_mr(&pd, ro_mem.as_mut_ptr(), REGION, Access::LOCAL_WRITE) }.unwrap();
        let src = RegisteredBuf::new(&dev, &pd, 4 * REGION, Access::LOCAL_WRITE).unwrap();
        for i in 0..src.buf().len() {
            src.buf().write(i, &[i as u8]).unwrap();
        }
        Node { qp, mr, ro_mr, src, cq, _pd: pd, dev, mem, ro_mem, tap, ip: ip(side) }
    }

    /// Checks that no byte outside the writable region changed.
    fn check_protection(&self, side: usize) {
        let mut guard = vec![0u8; REGION];
        for page in [0, 2] {
            self.mem.read(page * REGION, &mut guard).unwrap();
            if let Some(i) = guard.iter().position(|&b| b != GUARD_BYTE) {
                panic!(
                    "side {side}: byte {i} of guard page {page} overwritten (region at {:#x})",
                    self.mr.addr()
                );
            }
        }
        self.ro_mem.read(0, &mut guard).unwrap();
        if let Some(i) = guard.iter().position(|&b| b != READ_ONLY_BYTE) {
            panic!("side {side}: byte {i} of a region without REMOTE_WRITE overwritten");
        }
    }
}

fn connect(a: &Node, b: &Node) {
    let to_rtr = |qp: &SoftQp, peer: &Node, rq_psn: u32| {
        qp.modify(&QpModify::Init { port_num: 1, pkey_index: 0, access: Access::REMOTE_WRITE }).unwrap();
        qp.modify(&QpModify::Rtr {
            path_mtu: Mtu::Mtu1024,
            dest_qpn: peer.qp.qp_num(),
            rq_psn,
            dest: PortAddr::from_ipv4(peer.ip),
            max_dest_rd_atomic: 0,
            min_rnr_timer: 1,
        })
        .unwrap();
    };
    to_rtr(&a.qp, b, PSN[1]);
    to_rtr(&b.qp, a, PSN[0]);
    for (qp, sq_psn) in [(&a.qp, PSN[0]), (&b.qp, PSN[1])] {
        qp.modify(&QpModify::Rts { sq_psn, timeout: 10, retry_cnt: 3, rnr_retry: 3, max_rd_atomic: 0 })
            .unwrap();
    }
}

/// The two devices and the clock.
pub struct Pair {
    nodes: [Node; 2],
    now: Instant,
    next_wr: u64,
    _net: SimNet,
}

impl Default for Pair {
    fn default() -> Self {
        Pair::new()
    }
}

impl Pair {
    /// Two connected nodes on a fresh simulated network; each has 8 receives posted.
    pub fn new() -> Pair {
        let net = SimNet::new(1, Duration::from_micros(5));
        let nodes = [Node::new(&net, 0), Node::new(&net, 1)];
        connect(&nodes[0], &nodes[1]);
        let mut p = Pair { nodes, now: Instant::ZERO, next_wr: 1, _net: net };
        for side in [0, 1] {
            for _ in 0..8 {
                p.post_recv(side, 512);
            }
        }
        p
    }

    fn post_recv(&mut self, side: usize, len: u32) {
        let n = &self.nodes[side];
        let sge = Sge { addr: n.mr.addr(), length: len.min(REGION as u32), lkey: n.mr.lkey() };
        let _ = n.qp.post_recv(&[RecvWr { wr_id: self.next_wr, sg_list: &[sge] }]);
        self.next_wr += 1;
    }

    fn post_send(&mut self, side: usize, kind: u8, len: u16, offset: u16) {
        let (n, peer) = (&self.nodes[side], &self.nodes[1 - side]);
        let len = u32::from(len) % (3 * REGION as u32);
        let sge = n.src.sge(0, len);
        let op = match kind % 3 {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm { imm: u32::from(offset) },
            // Anywhere in the peer's region, or a little past it (refused with an access error).
            _ => SendOp::RdmaWrite {
                remote_addr: peer.mr.addr() + u64::from(offset % 4608),
                rkey: peer.mr.rkey(),
            },
        };
        let sg_list = if len == 0 { &[][..] } else { std::slice::from_ref(&sge) };
        let _ = n.qp.post_send(&[SendWr { wr_id: self.next_wr, op, sg_list, flags: SendFlags::SIGNALED }]);
        self.next_wr += 1;
    }

    /// Runs both devices at `now`, then drains what they report.
    fn progress(&mut self) {
        for (side, n) in self.nodes.iter().enumerate() {
            if let Err(e) = n.dev.progress(self.now) {
                panic!("side {side}: progress failed on the simulated wire: {e}");
            }
        }
        self.drain();
    }

    fn drain(&mut self) {
        let mut wcs = [Wc::default(); 32];
        for n in &self.nodes {
            loop {
                let k = n.cq.poll(&mut wcs);
                for wc in &wcs[..k] {
                    assert!(
                        wc.wr_id > 0 && wc.wr_id < self.next_wr.min(WR_ID_LIMIT),
                        "completion of an unposted WR: {wc:?}"
                    );
                    assert_eq!(wc.qp_num, n.qp.qp_num());
                }
                if k == 0 {
                    break;
                }
            }
            while n.dev.recv_mad().is_some() {}
            while n.dev.poll_async_event().is_some() {}
            let _ = (n.dev.stats(), n.qp.state());
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        Instant::min_deadline(self.nodes[0].dev.next_deadline(), self.nodes[1].dev.next_deadline())
    }

    fn run_to_deadline(&mut self) {
        if let Some(t) = self.next_deadline() {
            self.now = self.now.max(t);
        }
        self.progress();
    }

    /// Patches and queues one datagram for a node.
    fn inject(&mut self, c: &mut Cursor<'_>) {
        let flags = c.u8();
        let len = usize::from(c.u16() % 4400);
        let delta = c.u8() as i8;
        let offset = c.u16();
        let mut frame = c.bytes(len).to_vec();
        let to = usize::from(flags & ctl::TO_B != 0);
        let n = &self.nodes[to];
        let src = if flags & ctl::FROM_PEER != 0 { ip(1 - to) } else { stranger() };
        if frame.len() >= BTH_LEN {
            if flags & ctl::AIM_GSI != 0 {
                frame[5..8].copy_from_slice(&[0, 0, 1]);
            } else if flags & ctl::AIM_QP != 0 {
                frame[5..8].copy_from_slice(&n.qp.qp_num().to_be_bytes()[1..]);
            }
            if flags & ctl::AIM_PSN != 0 {
                // Requests: the receiver expects the peer's send-queue start PSN first. ACKs:
                // they acknowledge the receiver's own sends, from its start PSN on.
                let base = if frame[0] == Opcode::RcAck.as_u8() { PSN[to] } else { PSN[1 - to] };
                let psn = psn_add(base, (i32::from(delta) as u32) & PSN_MASK);
                frame[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
            }
            let reth_at = if Opcode::from_u8(frame[0]).is_ok_and(|op| op.has_deth()) {
                BTH_LEN + DETH_LEN
            } else {
                BTH_LEN
            };
            if flags & ctl::AIM_MEMORY != 0 && frame.len() >= reth_at + RETH_LEN {
                // Around the region: from 1 KiB before it to 1 KiB after it.
                let va = (n.mr.addr() + u64::from(offset % 6144)).wrapping_sub(1024);
                frame[reth_at..reth_at + 8].copy_from_slice(&va.to_be_bytes());
                let rkey = if offset & 0x8000 == 0 { n.mr.rkey() } else { n.ro_mr.rkey() };
                frame[reth_at + 8..reth_at + 12].copy_from_slice(&rkey.to_be_bytes());
            }
        }
        if flags & ctl::RESEAL != 0 {
            reseal(&IcrcMeta::new(src, n.ip, ROCEV2_UDP_PORT, ROCEV2_UDP_PORT), &mut frame);
        }
        let (bytes, seg) = if flags & ctl::GRO != 0 && !frame.is_empty() {
            ([frame.as_slice(), frame.as_slice()].concat(), frame.len())
        } else {
            (frame, 0)
        };
        let sealed = flags & ctl::RESEAL != 0 || flags & ctl::FROM_PEER == 0 || seg > 0;
        n.tap.lock().unwrap().push_back(Injected { src, bytes, seg, sealed });
    }

    /// Runs one operation from the input.
    pub fn step(&mut self, c: &mut Cursor<'_>) {
        match c.u8() % Op::COUNT {
            1 => {
                self.progress();
                self.now += Duration::from_micros(50 * u64::from(c.u8()));
            }
            2 => {
                for _ in 0..4 {
                    self.run_to_deadline();
                }
            }
            3 => {
                let side = usize::from(c.u8() & 1);
                let kind = c.u8();
                let (len, offset) = (c.u16(), c.u16());
                self.post_send(side, kind, len, offset);
            }
            4 => {
                let side = usize::from(c.u8() & 1);
                let len = u32::from(c.u8()) * 16;
                self.post_recv(side, len);
                self.drain();
            }
            _ => {
                self.inject(c);
                self.progress();
            }
        }
        for (side, n) in self.nodes.iter().enumerate() {
            n.check_protection(side);
        }
    }

    /// Both devices' transport counters.
    pub fn stats(&self) -> [lnd::fabric::FabricStats; 2] {
        [self.nodes[0].dev.stats(), self.nodes[1].dev.stats()]
    }

    /// Lets retransmissions and timers play out (bounded), checking protection at the end.
    pub fn run_down(&mut self) {
        for _ in 0..RUN_DOWN_STEPS {
            self.progress();
            match self.next_deadline() {
                Some(t) => self.now = self.now.max(t),
                None => break,
            }
        }
        for (side, n) in self.nodes.iter().enumerate() {
            n.check_protection(side);
        }
    }
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let mut pair = Pair::new();
    let mut c = Cursor::new(data);
    while !c.is_empty() {
        pair.step(&mut c);
    }
    pair.run_down();
}
