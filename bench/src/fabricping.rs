//! The fabric's own floor: SEND ping-pong on the software device between two processes, with
//! no LND and no LNet above it (what `ib_send_lat` is to a NIC).
//!
//! `lnd-bench fabric-ping` starts this executable as `fabric-pong --ip 127.0.0.1 --port P` (a
//! hidden command: it opens a software device, prints a ready line, and echoes every SEND
//! until standard input closes), then pings it from `127.0.0.2`. The two find each other with
//! one MAD exchange on QP1 (QPN and start PSN each way) and connect an RC QP pair; from then
//! on each side busy-polls the way the LND's scheduler does (the device's receive half, the
//! CQ, the device's transmit half), so the ACK of each SEND rides on the reply. The pinger
//! stamps each message with its sequence number and checks the echo's length and stamp.
//!
//! The round trip is everything the device does for a message (ring or UDP, RC transport,
//! CQ) and nothing else: a ping through LNet and the LND cannot be faster, so `compare` sets
//! both against it and against UCX.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use lnd::clock::Clock;
use lnd::driver::pacing::SpinPacing;
use lnd::fabric::dma::RegisteredBuf;
use lnd::fabric::soft::{SoftConfig, SoftCq, SoftDevice, SoftQp};
use lnd::fabric::{
    Access, CompletionQueue, Device, Mad, Mtu, PortAddr, QpCaps, QpInitAttr, QpModify, QueuePair, RecvWr,
    SendFlags, SendOp, SendWr, Wc, WcOpcode, WcStatus,
};
use lnd::time::Instant;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

/// The pinger's MAD: "LBP1", its QPN, its start PSN.
const HELLO: &[u8; 4] = b"LBP1";
/// The ponger's answer: "LBR1", its QPN, its start PSN.
const ANSWER: &[u8; 4] = b"LBR1";
/// Largest message: one receive slot.
pub const MAX_SIZE: usize = 4096;
/// Smallest message: the 8-byte sequence stamp.
pub const MIN_SIZE: usize = 8;
pub(crate) const SLOTS: usize = 64;
pub(crate) const PONG_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
pub(crate) const PING_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Looks at an idle device per turn, at most.
const POLLS_PER_LOOK: u32 = 64;
/// How long either side waits for the other to connect.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// What a fabric ping measured.
#[derive(Clone, Copy, Debug)]
pub struct FloorResult {
    /// Round trips completed (each one verified).
    pub pings: u64,
    /// Median round trip, µs.
    pub p50_us: f64,
    /// 99th percentile round trip, µs.
    pub p99_us: f64,
    /// Frames the pinger's device sent per round trip (1 when every ACK rides on a SEND).
    pub frames_per_ping: f64,
}

/// One end: a software device with one RC QP, its CQ, `SLOTS` receive slots and one send slot
/// (the pinger's; the ponger echoes from the slot a message arrived in).
pub(crate) struct End {
    pub(crate) dev: SoftDevice,
    cq: SoftCq,
    pub(crate) qp: SoftQp,
    pub(crate) slots: RegisteredBuf<SoftDevice>,
    pub(crate) psn: u32,
    pub(crate) clock: Clock,
    poll: Poll,
    events: Events,
    fds: Vec<RawFd>,
    pub(crate) wcs: [Wc; 32],
    /// When to ask the kernel which sockets became readable: as the LND's scheduler does.
    pacing: SpinPacing,
}

impl End {
    pub(crate) fn open(ip: Ipv4Addr, port: u16, psn: u32) -> Result<End, String> {
        let config =
            SoftConfig { udp_port: port, name: format!("fabric-ping-{ip}"), ..SoftConfig::default() };
        let dev =
            SoftDevice::open_udp(ip, config).map_err(|e| match crate::node::bind_hint(&e, ip, port) {
                Some(hint) => format!("{e} ({hint})"),
                None => e.to_string(),
            })?;
        let pd = dev.alloc_pd().map_err(|e| e.to_string())?;
        let cq = dev.create_cq(4 * SLOTS as u32).map_err(|e| e.to_string())?;
        let caps = QpInitAttr {
            cap: QpCaps {
                max_send_wr: SLOTS as u32,
                max_recv_wr: SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let qp = dev.create_qp(&pd, &cq, &cq, &caps).map_err(|e| e.to_string())?;
        let slots = RegisteredBuf::new(&dev, &pd, (SLOTS + 1) * MAX_SIZE, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        let poll = Poll::new().map_err(|e| e.to_string())?;
        let fds = dev.pollable_fds();
        for (i, fd) in fds.iter().enumerate() {
            poll.registry()
                .register(&mut SourceFd(fd), Token(i), Interest::READABLE)
                .map_err(|e| e.to_string())?;
        }
        // Edge-driven from the start: the device reads a socket only after it became readable.
        for &fd in &fds {
            dev.fd_readable(fd);
        }
        Ok(End {
            dev,
            cq,
            qp,
            slots,
            psn,
            clock: Clock::new(),
            poll,
            events: Events::with_capacity(16),
            fds,
            wcs: [Wc::default(); 32],
            pacing: SpinPacing::new(Instant::ZERO),
        })
    }

    /// Connects the QP to `dest`'s QP `dest_qpn` and posts every receive slot.
    pub(crate) fn connect(&self, dest: Ipv4Addr, dest_qpn: u32, dest_psn: u32) -> Result<(), String> {
        let steps = [
            QpModify::Init { port_num: 1, pkey_index: 0, access: Access::NONE },
            QpModify::Rtr {
                path_mtu: Mtu::Mtu4096,
                dest_qpn,
                rq_psn: dest_psn,
                dest: PortAddr::from_ipv4(dest),
                max_dest_rd_atomic: 0,
                min_rnr_timer: 4,
            },
            QpModify::Rts { sq_psn: self.psn, timeout: 14, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 0 },
        ];
        steps.iter().try_for_each(|m| self.qp.modify(m).map_err(|e| e.to_string()))?;
        (0..SLOTS).try_for_each(|slot| self.post_recv(slot))
    }

    pub(crate) fn post_recv(&self, slot: usize) -> Result<(), String> {
        let sge = self.slots.sge(slot * MAX_SIZE, MAX_SIZE as u32);
        self.qp.post_recv(&[RecvWr { wr_id: slot as u64, sg_list: &[sge] }]).map_err(|e| e.to_string())
    }

    /// SENDs `len` bytes of slot `slot`, signalled (the slot is reused after its completion),
    /// as the LND posts: with the time, so the device may transmit at once.
    pub(crate) fn send(&self, slot: usize, len: usize, now: Instant) -> Result<(), String> {
        let sge = self.slots.sge(slot * MAX_SIZE, len as u32);
        let wr = SendWr { wr_id: slot as u64, op: SendOp::Send, sg_list: &[sge], flags: SendFlags::SIGNALED };
        self.qp.post_send_at(&[wr], now).map_err(|e| e.to_string())
    }

    fn mad(&self, tag: &[u8; 4]) -> Mad {
        let mut mad: Mad = [0; 256];
        mad[..4].copy_from_slice(tag);
        mad[4..8].copy_from_slice(&self.qp.qp_num().to_be_bytes());
        mad[8..12].copy_from_slice(&self.psn.to_be_bytes());
        mad
    }

    /// The first half of a turn: the device's receive half, then the completions it made
    /// (into `self.wcs`; their count). The caller posts its answers, then calls [`End::finish`].
    pub(crate) fn reap(&mut self) -> Result<(Instant, usize), String> {
        let now = self.clock.now();
        self.dev.progress_receive(now).map_err(|e| e.to_string())?;
        Ok((now, self.cq.poll(&mut self.wcs)))
    }

    /// The second half: the device transmits what was posted, then, as the LND's scheduler
    /// does while busy-polling, the device is only looked at (`work_pending`, no transport
    /// work) until something arrives or `POLLS_PER_LOOK` looks have passed; the kernel is asked
    /// which sockets became readable (MADs, and frames that came by UDP) when the scheduler's
    /// pacing would ask it ([`SpinPacing`]: often while frames come by UDP, rarely while every
    /// frame comes through a same-host ring).
    fn finish(&mut self, now: Instant) -> Result<(), String> {
        self.dev.progress(now).map_err(|e| e.to_string())?;
        let mut looks = 0;
        while looks < POLLS_PER_LOOK && !self.dev.work_pending() {
            looks += 1;
            std::hint::spin_loop();
        }
        if self.pacing.poll_due(now) {
            let fd_events = self.poll_fds()?;
            self.pacing.polled(now, fd_events, self.dev.fd_packets());
        }
        Ok(())
    }

    /// Asks the kernel which sockets became readable (without waiting) and tells the device;
    /// whether any had.
    pub(crate) fn poll_fds(&mut self) -> Result<bool, String> {
        self.poll.poll(&mut self.events, Some(Duration::ZERO)).map_err(|e| e.to_string())?;
        let mut fd_events = false;
        for ev in self.events.iter() {
            if let Some(&fd) = self.fds.get(ev.token().0) {
                self.dev.fd_readable(fd);
                fd_events = true;
            }
        }
        Ok(fd_events)
    }

    /// The ponger's part of a turn: echoes each SEND among the first `n` completions from the
    /// slot it arrived in, and reposts a slot once its echo completed.
    #[inline]
    pub(crate) fn echo(&mut self, n: usize, now: Instant) -> Result<(), String> {
        for i in 0..n {
            let wc = self.wcs[i];
            check(&wc)?;
            let slot = wc.wr_id as usize;
            match wc.opcode {
                WcOpcode::Recv => self.send(slot, wc.byte_len as usize, now)?,
                _ => self.post_recv(slot)?,
            }
        }
        Ok(())
    }

    /// Stamps `stamp` with `seq` and SENDs it from the send slot (after the receive slots),
    /// which the caller rewrites only once the previous SEND from it completed.
    #[inline]
    pub(crate) fn send_stamped(&self, stamp: &mut [u8], seq: u64, now: Instant) -> Result<(), String> {
        stamp[..8].copy_from_slice(&seq.to_le_bytes());
        self.slots.buf().write(SLOTS * MAX_SIZE, stamp).map_err(|e| e.to_string())?;
        self.send(SLOTS, stamp.len(), now)
    }

    /// Checks that the receive `wc` is the echo of ping `seq` of `size` bytes.
    #[inline]
    pub(crate) fn check_echo(&self, wc: &Wc, size: usize, seq: u64) -> Result<(), String> {
        let mut echo = [0u8; 8];
        self.slots.buf().read(wc.wr_id as usize * MAX_SIZE, &mut echo).map_err(|e| e.to_string())?;
        let stamped = u64::from_le_bytes(echo);
        if wc.byte_len as usize != size || stamped != seq {
            return Err(format!(
                "echo {seq} of {size} bytes came back as {} bytes stamped {stamped}",
                wc.byte_len
            ));
        }
        Ok(())
    }
}

/// The arguments both fabric pings share: `size` within [`MIN_SIZE`]..=[`MAX_SIZE`], and a
/// port other than 0 (both ends must bind the same, known one).
pub(crate) fn check_args(what: &str, size: usize, port: u16) -> Result<(), String> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
        return Err(format!("size {size}: the {what} sends {MIN_SIZE} to {MAX_SIZE} bytes"));
    }
    if port == 0 {
        return Err("port 0: both ends need the same, known UDP port".to_owned());
    }
    Ok(())
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A completion that is not a success, as an error.
pub(crate) fn check(wc: &Wc) -> Result<(), String> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(format!("completion failed: {:?} (wr_id {}, QP {:#x})", wc.status, wc.wr_id, wc.qp_num))
    }
}

/// The hidden `fabric-pong` command: echoes SENDs until standard input closes.
pub fn pong(ip: Ipv4Addr, port: u16) -> Result<(), String> {
    let mut end = End::open(ip, port, 0x12_3456)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        flag.store(true, Ordering::SeqCst);
    });
    println!("fabric-pong ready on {ip} port {port}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut connected = false;
    while !stop.load(Ordering::Relaxed) {
        let (now, n) = end.reap()?;
        end.echo(n, now)?;
        while let Some((from, mad)) = end.dev.recv_mad() {
            let Some(src) = from.gid.to_ipv4().filter(|_| &mad[..4] == HELLO) else { continue };
            if !connected {
                end.connect(src, be32(&mad, 4), be32(&mad, 8))?;
                connected = true;
            }
            // Every hello is answered (an answer may be lost).
            end.dev.send_mad(&from, &end.mad(ANSWER)).map_err(|e| e.to_string())?;
        }
        end.finish(now)?;
    }
    Ok(())
}

/// Pings a `fabric-pong` child on `port` with `size`-byte SENDs for `duration`.
pub fn measure(size: usize, duration: Duration, port: u16) -> Result<FloorResult, String> {
    check_args("fabric ping", size, port)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let mut child = Command::new(exe)
        .args(["fabric-pong", "--ip", &PONG_IP.to_string(), "--port", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the fabric pong: {e}"))?;
    let ready = child.stdout.take().and_then(|out| BufReader::new(out).lines().next()).and_then(Result::ok);
    let result = match ready {
        Some(line) if line.starts_with("fabric-pong ready") => ping(size, duration, port),
        _ => Err("the fabric pong did not start (its error is above)".to_owned()),
    };
    drop(child.stdin.take());
    let _ = child.wait();
    result
}

fn ping(size: usize, duration: Duration, port: u16) -> Result<FloorResult, String> {
    let mut end = End::open(PING_IP, port, 0xfe_dcba)?;
    let start = end.clock.now();
    let mut next_hello = start;
    loop {
        let (now, _) = end.reap()?;
        if now.saturating_duration_since(start) > SETUP_TIMEOUT {
            return Err(format!("the fabric pong on {PONG_IP} port {port} did not answer"));
        }
        if let Some((_, mad)) = end.dev.recv_mad().filter(|(_, m)| &m[..4] == ANSWER) {
            end.connect(PONG_IP, be32(&mad, 4), be32(&mad, 8))?;
            break;
        }
        if now >= next_hello {
            end.dev.send_mad(&PortAddr::from_ipv4(PONG_IP), &end.mad(HELLO)).map_err(|e| e.to_string())?;
            next_hello = now + Duration::from_millis(100);
        }
        end.finish(now)?;
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())?;
    let (mut seq, mut sent_at) = (0u64, end.clock.now());
    let (mut answered, mut tx_done) = (true, true);
    let mut pings = 0u64;
    let warmup = 1000;
    let deadline = end.clock.now() + duration;
    let mut frames_before = None;
    let mut stamp = vec![0u8; size];
    loop {
        let (now, n) = end.reap()?;
        for i in 0..n {
            let wc = end.wcs[i];
            check(&wc)?;
            match wc.opcode {
                WcOpcode::Recv => {
                    end.check_echo(&wc, size, seq)?;
                    answered = true;
                    if seq == warmup {
                        frames_before = Some(end.dev.stats().tx_packets);
                    }
                    if seq >= warmup {
                        let ns = end.clock.now().saturating_duration_since(sent_at).as_nanos();
                        latency.saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
                        pings += 1;
                    }
                    end.post_recv(wc.wr_id as usize)?;
                }
                _ => tx_done = true,
            }
        }
        if answered && tx_done {
            if now >= deadline && seq >= warmup {
                break;
            }
            seq += 1;
            sent_at = end.clock.now();
            end.send_stamped(&mut stamp, seq, sent_at)?;
            (answered, tx_done) = (false, false);
        } else if now.saturating_duration_since(sent_at) > SETUP_TIMEOUT {
            return Err(format!("ping {seq} was not answered within {SETUP_TIMEOUT:?}"));
        }
        end.finish(now)?;
    }
    let us = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    let frames = end.dev.stats().tx_packets.saturating_sub(frames_before.unwrap_or(0));
    let frames_per_ping = frames as f64 / pings.max(1) as f64;
    Ok(FloorResult { pings, p50_us: us(0.5), p99_us: us(0.99), frames_per_ping })
}
