//! The software device's own work per message, apart from everything a round trip between
//! two processes adds to it.
//!
//! `lnd-bench fabric-turns` runs `fabric-ping`'s SEND ping-pong between two devices
//! (`127.0.0.1` and `127.0.0.2`, connected through a same-host frame ring each way) that live
//! in this one process and are driven *in turn* by one thread: the pinger posts a SEND, the
//! ponger takes its turn (the device's receive half, its completions, the echo posted, the
//! device's transmit half), then the pinger does the same with the echo. Nothing waits and
//! nothing spins, no cache line crosses to another core, no thread is woken: the time per
//! round trip is the CPU work of both devices for two messages, and under
//! `valgrind --tool=callgrind` the instructions per round trip are the same on every run,
//! whatever the machine is doing (take the difference of two counts to drop the set-up). It
//! is what a change to the device's per-message path is measured with; `fabric-ping` then
//! shows what it does to a real round trip.
//!
//! Every echo is checked (length and sequence stamp), as `fabric-ping` checks it.

use lnd::fabric::{Device, QueuePair, WcOpcode};

use crate::fabricping::{self, End, MAX_SIZE, MIN_SIZE, PING_IP, PONG_IP, SLOTS};

/// Round trips before the measured ones, with the sockets polled on every turn: the first
/// frames go by UDP and the rings open on their doorbells.
const WARM_UP: u64 = 1000;
/// Turns of both devices a round trip may take before it counts as lost (each takes one).
const MAX_TURNS: u32 = 10_000;
/// The pinger's send slot (after its receive slots).
const TX: usize = SLOTS;

/// What a run measured.
#[derive(Clone, Copy, Debug)]
pub struct TurnsResult {
    /// Round trips measured (each one verified).
    pub round_trips: u64,
    /// Mean time per round trip, ns: both devices' work for a SEND and its echo.
    pub ns_per_round_trip: f64,
    /// Frames the pinger's device sent per round trip (1 when every ACK rides on a SEND).
    pub frames_per_round_trip: f64,
    /// Frames that went through the same-host rings, both devices, per round trip (2 when
    /// none went by UDP).
    pub ring_frames_per_round_trip: f64,
}

/// The pinger, the ponger and the stamp of the last ping.
struct Pair {
    ping: End,
    pong: End,
    seq: u64,
    stamp: Vec<u8>,
    /// The echo of ping `seq` arrived.
    echoed: bool,
    /// Ping `seq`'s SEND completed.
    sent: bool,
}

/// Runs `count` measured round trips of `size`-byte SENDs on UDP port `port`.
pub fn measure(size: usize, count: u64, port: u16) -> Result<TurnsResult, String> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
        return Err(format!("size {size}: the fabric turns send {MIN_SIZE} to {MAX_SIZE} bytes"));
    }
    if port == 0 {
        return Err("port 0: both devices need the same, known UDP port".to_owned());
    }
    if count == 0 {
        return Err("count 0: nothing to measure".to_owned());
    }
    let ping = End::open(PING_IP, port, 0xfe_dcba)?;
    let pong = End::open(PONG_IP, port, 0x12_3456)?;
    pong.connect(PING_IP, ping.qp.qp_num(), ping.psn)?;
    ping.connect(PONG_IP, pong.qp.qp_num(), pong.psn)?;
    let mut pair = Pair { ping, pong, seq: 0, stamp: vec![0u8; size], echoed: false, sent: false };
    pair.run(WARM_UP, true)?;
    let frames = |p: &Pair| p.ping.dev.stats().tx_packets;
    let rings = |p: &Pair| p.ping.dev.stats().ring_frames_sent + p.pong.dev.stats().ring_frames_sent;
    let (frames_before, rings_before) = (frames(&pair), rings(&pair));
    let start = pair.ping.clock.now();
    pair.run(count, false)?;
    let elapsed = pair.ping.clock.now().saturating_duration_since(start);
    let per = |n: u64| n as f64 / count as f64;
    Ok(TurnsResult {
        round_trips: count,
        ns_per_round_trip: elapsed.as_nanos() as f64 / count as f64,
        frames_per_round_trip: per(frames(&pair).saturating_sub(frames_before)),
        ring_frames_per_round_trip: per(rings(&pair).saturating_sub(rings_before)),
    })
}

impl Pair {
    /// `count` pings, each posted as the pinger handles the echo before it (as `fabric-ping`
    /// posts them: the ACK of the echo rides on the next ping). `poll`: ask the kernel about
    /// the sockets on every turn (while the rings are not open yet).
    fn run(&mut self, count: u64, poll: bool) -> Result<(), String> {
        let now = self.ping.clock.now();
        self.post_ping(now)?;
        for left in (0..count).rev() {
            let mut turns = 0;
            loop {
                if poll {
                    self.pong.poll_fds()?;
                    self.ping.poll_fds()?;
                }
                self.pong_turn()?;
                if self.ping_turn(left > 0)? {
                    break;
                }
                turns += 1;
                if turns == MAX_TURNS {
                    return Err(format!(
                        "ping {} was not echoed within {MAX_TURNS} turns of both devices",
                        self.seq
                    ));
                }
            }
        }
        Ok(())
    }

    /// Stamps and posts the next ping. Its slot is rewritten only after the previous SEND
    /// completed.
    fn post_ping(&mut self, now: lnd::time::Instant) -> Result<(), String> {
        self.seq += 1;
        self.stamp[..8].copy_from_slice(&self.seq.to_le_bytes());
        self.ping.slots.buf().write(TX * MAX_SIZE, &self.stamp).map_err(|e| e.to_string())?;
        self.ping.send(TX, self.stamp.len(), now)
    }

    /// The ponger's turn: echo every SEND from the slot it arrived in (reposted once the echo
    /// completes).
    fn pong_turn(&mut self) -> Result<(), String> {
        let end = &mut self.pong;
        let (now, n) = end.reap()?;
        for i in 0..n {
            let wc = end.wcs[i];
            fabricping::check(&wc)?;
            let slot = wc.wr_id as usize;
            match wc.opcode {
                WcOpcode::Recv => end.send(slot, wc.byte_len as usize, now)?,
                _ => end.post_recv(slot)?,
            }
        }
        end.dev.progress(now).map_err(|e| e.to_string())
    }

    /// The pinger's turn: whether the round trip is over (the echo arrived, checked, and the
    /// SEND completed); if it is and `next`, the next ping is posted before the device's
    /// transmit half.
    fn ping_turn(&mut self, next: bool) -> Result<bool, String> {
        let (now, n) = self.ping.reap()?;
        for i in 0..n {
            let wc = self.ping.wcs[i];
            fabricping::check(&wc)?;
            if wc.opcode != WcOpcode::Recv {
                self.sent = true;
                continue;
            }
            let slot = wc.wr_id as usize;
            let mut echo = [0u8; 8];
            self.ping.slots.buf().read(slot * MAX_SIZE, &mut echo).map_err(|e| e.to_string())?;
            if wc.byte_len as usize != self.stamp.len() || u64::from_le_bytes(echo) != self.seq {
                return Err(format!(
                    "echo {} of {} bytes came back as {} bytes stamped {}",
                    self.seq,
                    self.stamp.len(),
                    wc.byte_len,
                    u64::from_le_bytes(echo)
                ));
            }
            self.echoed = true;
            self.ping.post_recv(slot)?;
        }
        let over = self.echoed && self.sent;
        if over {
            (self.echoed, self.sent) = (false, false);
            if next {
                self.post_ping(now)?;
            }
        }
        self.ping.dev.progress(now).map_err(|e| e.to_string())?;
        Ok(over)
    }
}
