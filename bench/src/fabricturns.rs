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

use crate::fabricping::{self, End, PING_IP, PONG_IP};

/// Round trips before the measured ones, with the sockets polled on every turn: the first
/// frames go by UDP and the rings open on their doorbells.
const WARM_UP: u64 = 1000;
/// Turns of both devices a round trip may take before it counts as lost (each takes one).
const MAX_TURNS: u32 = 10_000;

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
    fabricping::check_args("fabric turns", size, port)?;
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
        self.ping.send_stamped(&mut self.stamp, self.seq, now)
    }

    /// The ponger's turn: echo every SEND from the slot it arrived in (reposted once the echo
    /// completes).
    fn pong_turn(&mut self) -> Result<(), String> {
        let end = &mut self.pong;
        let (now, n) = end.reap()?;
        end.echo(n, now)?;
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
            self.ping.check_echo(&wc, self.stamp.len(), self.seq)?;
            self.echoed = true;
            self.ping.post_recv(wc.wr_id as usize)?;
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
