//! `soft-peer`: one end of a two-process RDMA test over the software device on real UDP.
//!
//! ```text
//! soft-peer target    --ip 127.0.0.2 --port P --messages N --size BYTES
//! soft-peer initiator --ip 127.0.0.1 --target 127.0.0.2 --port P --messages N --size BYTES --window W
//! ```
//! The initiator finds the target with a MAD exchange on QP1 (its QPN and start PSN for the
//! target's; the target answers with its QPN, PSN and a registered buffer of slots). It then
//! RDMA-WRITEs message `m` into slot `m % slots` and SENDs immediate data `m` to name it; the
//! target verifies every byte of the slot and SENDs `m` back to free the slot. Both exit 0 only
//! if all `N` messages were verified; the initiator prints the bandwidth.

use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::process::ExitCode;
use std::time::Duration;

use lnd::clock::Clock;
use lnd::fabric::dma::RegisteredBuf;
use lnd::fabric::soft::{SoftConfig, SoftDevice};
use lnd::fabric::{
    Access, CompletionQueue, Device, Mad, Mtu, PortAddr, QpCaps, QpInitAttr, QpModify, QueuePair, RecvWr,
    SendFlags, SendOp, SendWr, Wc, WcStatus,
};
use lnd::time::Instant;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

const HELLO: &[u8; 4] = b"SPH1";
const REPLY: &[u8; 4] = b"SPR1";
const SLOTS: usize = 16;
const RECVS: u64 = 64;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

struct Args {
    role: String,
    ip: Ipv4Addr,
    target: Option<Ipv4Addr>,
    port: u16,
    messages: u64,
    size: usize,
    window: u64,
    deadline: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let role = it.next().ok_or("usage: soft-peer target|initiator [options]")?;
    let mut a = Args {
        role,
        ip: Ipv4Addr::LOCALHOST,
        target: None,
        port: 4791,
        messages: 256,
        size: 1 << 20,
        window: 8,
        deadline: Duration::from_secs(120),
    };
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = || format!("bad value for {flag}: {v}");
        match flag.as_str() {
            "--ip" => a.ip = v.parse().map_err(|_| bad())?,
            "--target" => a.target = Some(v.parse().map_err(|_| bad())?),
            "--port" => a.port = v.parse().map_err(|_| bad())?,
            "--messages" => a.messages = v.parse().map_err(|_| bad())?,
            "--size" => a.size = v.parse().map_err(|_| bad())?,
            "--window" => a.window = v.parse().map_err(|_| bad())?,
            "--deadline-secs" => a.deadline = Duration::from_secs(v.parse().map_err(|_| bad())?),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.window as usize > SLOTS || a.window == 0 {
        return Err(format!("--window must be 1..={SLOTS}"));
    }
    Ok(a)
}

/// The 8-byte word `i` of message `m`.
fn word(m: u64, i: usize) -> u64 {
    (m << 40) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x0be9_1b91
}

// Whole words as integers (a per-chunk slice copy or compare is a libc call per 8 bytes, which
// made these two the bottleneck of the measurement); the tail byte by byte.
fn fill(buf: &mut [u8], m: u64) {
    let mut words = buf.chunks_exact_mut(8);
    let mut i = 0;
    for chunk in &mut words {
        if let Ok(c) = <&mut [u8; 8]>::try_from(chunk) {
            *c = word(m, i).to_le_bytes();
        }
        i += 1;
    }
    for (d, s) in words.into_remainder().iter_mut().zip(word(m, i).to_le_bytes()) {
        *d = s;
    }
}

fn verify(buf: &[u8], m: u64) -> bool {
    let words = buf.chunks_exact(8);
    let tail = words.remainder();
    let n = words.len();
    let body = words.enumerate().fold(true, |ok, (i, chunk)| {
        ok & (<[u8; 8]>::try_from(chunk).ok().map(u64::from_le_bytes) == Some(word(m, i)))
    });
    body && tail.iter().zip(word(m, n).to_le_bytes()).all(|(a, b)| *a == b)
}

/// The pieces of the event loop both roles share.
struct Peer {
    dev: SoftDevice,
    clock: Clock,
    poll: Poll,
    events: Events,
    cq: lnd::fabric::soft::SoftCq,
    wcs: Vec<Wc>,
}

impl Peer {
    fn new(ip: Ipv4Addr, port: u16) -> Result<(Peer, lnd::fabric::soft::SoftPd), String> {
        let config = SoftConfig { udp_port: port, name: format!("soft-{ip}"), ..SoftConfig::default() };
        let dev = SoftDevice::open_udp(ip, config).map_err(|e| e.to_string())?;
        let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
        let cq = dev.create_cq(4096).map_err(|e| e.to_string())?;
        let poll = Poll::new().map_err(|e| e.to_string())?;
        let fds: Vec<RawFd> = dev.pollable_fds().into_iter().chain([cq.event_fd()]).collect();
        for (i, fd) in fds.iter().enumerate() {
            poll.registry()
                .register(&mut SourceFd(fd), Token(i), Interest::READABLE)
                .map_err(|e| e.to_string())?;
        }
        let peer =
            Peer { dev, clock: Clock::new(), poll, events: Events::with_capacity(16), cq, wcs: Vec::new() };
        Ok((peer, pd))
    }

    /// One turn: progress the device, reap completions, sleep until the next event.
    fn turn(&mut self) -> Result<Instant, String> {
        let now = self.clock.now();
        self.dev.progress(now).map_err(|e| e.to_string())?;
        let mut batch = [Wc::default(); 64];
        loop {
            let n = self.cq.poll(&mut batch);
            self.wcs.extend_from_slice(&batch[..n]);
            if n < batch.len() {
                break;
            }
        }
        if !self.wcs.is_empty() {
            return Ok(now);
        }
        self.cq.req_notify(false).map_err(|e| e.to_string())?;
        let n = self.cq.poll(&mut batch);
        if n > 0 {
            self.wcs.extend_from_slice(&batch[..n]);
            return Ok(now);
        }
        let timeout = match self.dev.next_deadline() {
            Some(t) if t <= now => Some(Duration::ZERO),
            Some(t) => Some(t.saturating_duration_since(now).min(Duration::from_millis(100))),
            None => Some(Duration::from_millis(100)),
        };
        // Same-host peers write into shared memory: ask them to ring before sleeping.
        let asleep = timeout != Some(Duration::ZERO) && self.dev.prepare_to_sleep();
        let timeout = if asleep { timeout } else { Some(Duration::ZERO) };
        let polled = self.poll.poll(&mut self.events, timeout);
        if asleep {
            self.dev.awake();
        }
        polled.map_err(|e| e.to_string())?;
        self.cq.get_event();
        Ok(now)
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

fn caps() -> QpInitAttr {
    QpInitAttr {
        cap: QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    }
}

fn connect_qp<Q: QueuePair>(
    qp: &Q,
    dest: Ipv4Addr,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
) -> Result<(), String> {
    let steps = [
        QpModify::Init { port_num: 1, pkey_index: 0, access: Access::REMOTE_WRITE },
        QpModify::Rtr {
            path_mtu: Mtu::Mtu4096,
            dest_qpn,
            rq_psn,
            dest: PortAddr::from_ipv4(dest),
            max_dest_rd_atomic: 0,
            min_rnr_timer: 4,
        },
        QpModify::Rts { sq_psn, timeout: 14, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 0 },
    ];
    steps.iter().try_for_each(|m| qp.modify(m).map_err(|e| e.to_string()))
}

fn target(a: &Args) -> Result<(), String> {
    let (mut peer, pd) = Peer::new(a.ip, a.port)?;
    let slots = RegisteredBuf::new(&peer.dev, &pd, SLOTS * a.size, RW).map_err(|e| e.to_string())?;
    let ctl = RegisteredBuf::new(&peer.dev, &pd, 64, RW).map_err(|e| e.to_string())?;
    let qp = peer.dev.create_qp(&pd, &peer.cq, &peer.cq, &caps()).map_err(|e| e.to_string())?;
    let my_psn: u32 = 0x12_3456;
    let mut connected = false;
    let mut verified = 0u64;
    let mut scratch = vec![0u8; a.size];
    let start = peer.clock.now();
    while verified < a.messages {
        let now = peer.turn()?;
        if now.saturating_duration_since(start) > a.deadline {
            return Err(format!("deadline passed after {verified} messages"));
        }
        while let Some((from, mad)) = peer.dev.recv_mad() {
            if &mad[..4] != HELLO {
                continue;
            }
            let Some(src) = from.gid.to_ipv4() else { continue };
            if !connected {
                connect_qp(&qp, src, be32(&mad, 4), be32(&mad, 8), my_psn)?;
                for i in 0..RECVS {
                    qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[ctl.sge(0, 0)] }])
                        .map_err(|e| e.to_string())?;
                }
                connected = true;
            }
            let mut reply: Mad = [0; 256];
            reply[..4].copy_from_slice(REPLY);
            reply[4..8].copy_from_slice(&qp.qp_num().to_be_bytes());
            reply[8..12].copy_from_slice(&my_psn.to_be_bytes());
            reply[12..16].copy_from_slice(&slots.rkey().to_be_bytes());
            reply[16..24].copy_from_slice(&slots.addr_at(0).to_be_bytes());
            peer.dev.send_mad(&from, &reply).map_err(|e| e.to_string())?;
        }
        for wc in std::mem::take(&mut peer.wcs) {
            if wc.status != WcStatus::Success {
                return Err(format!("completion failed: {wc:?}"));
            }
            let Some(m) = wc.imm_data else { continue }; // a credit SEND of ours completed
            let m = u64::from(m);
            let slot = (m as usize) % SLOTS;
            slots.buf().read(slot * a.size, &mut scratch).map_err(|e| e.to_string())?;
            if m != verified || !verify(&scratch, m) {
                return Err(format!("message {m} (expected {verified}) failed verification"));
            }
            verified += 1;
            qp.post_recv(&[RecvWr { wr_id: wc.wr_id, sg_list: &[ctl.sge(0, 0)] }])
                .map_err(|e| e.to_string())?;
            let credit = SendWr {
                wr_id: m,
                op: SendOp::SendWithImm { imm: m as u32 },
                sg_list: &[],
                flags: SendFlags::UNSIGNALED,
            };
            qp.post_send(&[credit]).map_err(|e| e.to_string())?;
        }
    }
    // Let the last credits and ACKs leave before exiting.
    let end = peer.clock.now() + Duration::from_millis(200);
    while peer.turn()? < end {}
    let st = peer.dev.stats();
    println!(
        "target: verified {verified} messages, {} bytes (single copy: placed {} writes, {} bytes, mapped {}, refused {}, ring frames {})",
        verified * a.size as u64,
        st.placed_writes,
        st.placed_bytes,
        st.placed_mapped,
        st.placed_refused,
        st.ring_frames_sent + st.ring_frames_received
    );
    Ok(())
}

fn initiator(a: &Args) -> Result<(), String> {
    let target_ip = a.target.ok_or("--target is required")?;
    let (mut peer, pd) = Peer::new(a.ip, a.port)?;
    let src = RegisteredBuf::new(&peer.dev, &pd, SLOTS * a.size, RW).map_err(|e| e.to_string())?;
    let ctl = RegisteredBuf::new(&peer.dev, &pd, 64, RW).map_err(|e| e.to_string())?;
    let qp = peer.dev.create_qp(&pd, &peer.cq, &peer.cq, &caps()).map_err(|e| e.to_string())?;
    let my_psn: u32 = 0xfe_dcba;
    let mut hello: Mad = [0; 256];
    hello[..4].copy_from_slice(HELLO);
    hello[4..8].copy_from_slice(&qp.qp_num().to_be_bytes());
    hello[8..12].copy_from_slice(&my_psn.to_be_bytes());
    let start = peer.clock.now();
    let mut next_hello = start;
    let (rkey, raddr) = loop {
        let now = peer.turn()?;
        if now.saturating_duration_since(start) > a.deadline {
            return Err("target did not answer".into());
        }
        if let Some((_, mad)) = peer.dev.recv_mad() {
            if &mad[..4] == REPLY {
                connect_qp(&qp, target_ip, be32(&mad, 4), be32(&mad, 8), my_psn)?;
                break (be32(&mad, 12), be64(&mad, 16));
            }
        }
        if now >= next_hello {
            peer.dev.send_mad(&PortAddr::from_ipv4(target_ip), &hello).map_err(|e| e.to_string())?;
            next_hello = now + Duration::from_millis(100);
        }
    };
    for i in 0..RECVS {
        qp.post_recv(&[RecvWr { wr_id: i, sg_list: &[ctl.sge(0, 0)] }]).map_err(|e| e.to_string())?;
    }
    let mut message = vec![0u8; a.size];
    let (mut posted, mut credited) = (0u64, 0u64);
    let t0 = peer.clock.now();
    while credited < a.messages {
        while posted < a.messages && posted - credited < a.window {
            let slot = (posted as usize) % SLOTS;
            fill(&mut message, posted);
            src.buf().write(slot * a.size, &message).map_err(|e| e.to_string())?;
            let sge = src.sge(slot * a.size, a.size as u32);
            let wrs = [
                SendWr {
                    wr_id: posted * 2,
                    op: SendOp::RdmaWrite { remote_addr: raddr + (slot * a.size) as u64, rkey },
                    sg_list: &[sge],
                    flags: SendFlags::UNSIGNALED,
                },
                SendWr {
                    wr_id: posted * 2 + 1,
                    op: SendOp::SendWithImm { imm: posted as u32 },
                    sg_list: &[],
                    flags: SendFlags::UNSIGNALED,
                },
            ];
            qp.post_send(&wrs).map_err(|e| e.to_string())?;
            posted += 1;
        }
        let now = peer.turn()?;
        if now.saturating_duration_since(start) > a.deadline {
            return Err(format!("deadline passed after {credited} messages"));
        }
        for wc in std::mem::take(&mut peer.wcs) {
            if wc.status != WcStatus::Success {
                return Err(format!("completion failed: {wc:?}"));
            }
            if wc.imm_data.is_some() {
                credited += 1;
                qp.post_recv(&[RecvWr { wr_id: wc.wr_id, sg_list: &[ctl.sge(0, 0)] }])
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    let secs = peer.clock.now().saturating_duration_since(t0).as_secs_f64();
    let mib = (a.messages * a.size as u64) as f64 / f64::from(1 << 20);
    let st = peer.dev.stats();
    println!(
        "initiator: {} messages of {} bytes, window {}: {mib:.0} MiB in {secs:.3} s = {:.1} MiB/s (retransmits {}, timeouts {}, single copy: placed {}, refused {}, ring frames {})",
        a.messages,
        a.size,
        a.window,
        mib / secs,
        st.retransmits,
        st.timeouts,
        st.placed_sent,
        st.placed_refused,
        st.ring_frames_sent + st.ring_frames_received
    );
    Ok(())
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|a| match a.role.as_str() {
        "target" => target(&a),
        "initiator" => initiator(&a),
        other => Err(format!("unknown role {other}")),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soft-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
