//! Seeded, deterministic fault injection for the software device's wire.
//!
//! [`FaultyWire`] wraps any [`Wire`] and, with the probabilities of a [`FaultConfig`], drops,
//! duplicates, reorders, delays or corrupts frames, separately for the transmit and the receive
//! direction. Held frames are released when `now` reaches their time, and the wrapper reports
//! that time as its deadline, so simulations stay deterministic and real runs need no thread.
//! Corruption flips one random bit: the receiver's ICRC check must catch it.

use std::collections::BTreeMap;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::time::Duration;

use super::packet::{self, IcrcMeta};
use super::wire::{Received, Wire};
use crate::rng::Rng;
use crate::time::Instant;

/// Fault probabilities for one direction, each in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct DirFaults {
    /// Probability a frame is dropped.
    pub drop: f64,
    /// Probability a frame is delivered twice.
    pub duplicate: f64,
    /// Probability a frame is held back briefly so that later frames overtake it.
    pub reorder: f64,
    /// Probability a frame is delayed by up to `delay_max`.
    pub delay: f64,
    /// The longest delay (also bounds the reorder hold).
    pub delay_max: Duration,
    /// Probability one bit of the frame is flipped.
    pub corrupt: f64,
}

impl DirFaults {
    /// No faults.
    pub const NONE: DirFaults = DirFaults {
        drop: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        delay: 0.0,
        delay_max: Duration::ZERO,
        corrupt: 0.0,
    };

    /// Drops with probability `p`, nothing else.
    pub fn lossy(p: f64) -> DirFaults {
        DirFaults { drop: p, ..DirFaults::NONE }
    }

    fn is_none(&self) -> bool {
        self.drop <= 0.0
            && self.duplicate <= 0.0
            && self.reorder <= 0.0
            && self.delay <= 0.0
            && self.corrupt <= 0.0
    }
}

/// Fault probabilities for both directions of a device's wire.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct FaultConfig {
    /// Applied to frames this device sends.
    pub tx: DirFaults,
    /// Applied to frames this device receives.
    pub rx: DirFaults,
}

impl FaultConfig {
    /// No faults in either direction.
    pub const NONE: FaultConfig = FaultConfig { tx: DirFaults::NONE, rx: DirFaults::NONE };

    /// The same faults in both directions.
    pub fn symmetric(f: DirFaults) -> FaultConfig {
        FaultConfig { tx: f, rx: f }
    }
}

/// What the injector did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames dropped.
    pub dropped: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames held back to be overtaken.
    pub reordered: u64,
    /// Frames delayed.
    pub delayed: u64,
    /// Frames with a flipped bit.
    pub corrupted: u64,
    /// Frames lost because the link was down ([`FaultyWire::set_link_down`]; not counted in
    /// `dropped`).
    pub link_down: u64,
}

/// A wire with fault injection in front of it.
pub struct FaultyWire {
    inner: Box<dyn Wire>,
    config: FaultConfig,
    rng: Rng,
    seq: u64,
    tx_held: BTreeMap<(Instant, u64), (Ipv4Addr, Vec<u8>)>,
    rx_held: BTreeMap<(Instant, u64), (Received, Vec<u8>)>,
    stats: FaultStats,
    /// The link is down: every frame is lost, both ways, whatever `config` says.
    link_down: bool,
    /// Nothing to inject: the link is up and `config` has no fault either way (kept with
    /// them, so that the per-frame check is one flag).
    quiet: bool,
}

impl std::fmt::Debug for FaultyWire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyWire").field("config", &self.config).field("stats", &self.stats).finish()
    }
}

/// How long a reordered frame is held when no `delay_max` is configured.
const DEFAULT_REORDER_HOLD: Duration = Duration::from_micros(20);

enum Fate {
    Drop,
    Deliver { copies: u8, hold: Option<Duration>, corrupt: bool },
}

impl FaultyWire {
    /// Wraps `inner`; `seed` makes the faults reproducible.
    pub fn new(inner: Box<dyn Wire>, config: FaultConfig, seed: u64) -> FaultyWire {
        let mut wire = FaultyWire {
            inner,
            config,
            rng: Rng::new(seed),
            seq: 0,
            tx_held: BTreeMap::new(),
            rx_held: BTreeMap::new(),
            stats: FaultStats::default(),
            link_down: false,
            quiet: false,
        };
        wire.update_quiet();
        wire
    }

    /// [`Wire::recv`] with faults to inject or frames held: the pass-through case stays a
    /// small function of its own.
    #[inline(never)]
    fn recv_with_faults(&mut self, now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>> {
        self.release_tx(now)?;
        loop {
            if let Some(entry) = self.rx_held.first_entry() {
                if entry.key().0 <= now {
                    let (mut meta, bytes) = entry.remove();
                    if self.link_down {
                        self.stats.link_down += 1;
                        continue;
                    }
                    let n = bytes.len().min(buf.len());
                    if let (Some(d), Some(s)) = (buf.get_mut(..n), bytes.get(..n)) {
                        d.copy_from_slice(s);
                    }
                    meta.len = n;
                    return Ok(Some(meta));
                }
            }
            let Some(mut meta) = self.inner.recv(now, buf)? else {
                return Ok(None);
            };
            if !meta.sealed {
                // An unsealed frame from a ring (its sender saw no faults) meets this side's:
                // seal it as its link would have, so that a corruption below is caught.
                let m = IcrcMeta::new(meta.src, self.inner.local_ip(), meta.src_port, self.inner.udp_port());
                let _ = buf.get_mut(..meta.len).map(|f| packet::seal(&m, f));
                meta.sealed = true;
            }
            if meta.seg > 0 && (self.link_down || !self.config.rx.is_none()) {
                // Faults apply frame by frame: keep the coalesced followers in arrival order.
                let seg = meta.seg;
                let followers: Vec<Vec<u8>> =
                    buf.get(seg..meta.len).unwrap_or_default().chunks(seg).map(<[u8]>::to_vec).collect();
                for f in followers {
                    let seq = self.next_seq();
                    let single = Received::single(meta.src, meta.src_port, f.len());
                    self.rx_held.insert((now, seq), (single, f));
                }
                meta = Received::single(meta.src, meta.src_port, seg);
            }
            match self.fate(self.config.rx) {
                Fate::Drop => continue,
                Fate::Deliver { copies: 1, hold: None, corrupt: false } => return Ok(Some(meta)),
                Fate::Deliver { copies, hold, corrupt } => {
                    let frame = buf.get_mut(..meta.len).unwrap_or_default();
                    if corrupt {
                        self.flip_bit(frame);
                    }
                    let bytes = buf.get(..meta.len).unwrap_or_default().to_vec();
                    let held = usize::from(copies) - usize::from(hold.is_none());
                    for _ in 0..held {
                        let seq = self.next_seq();
                        self.rx_held.insert((now + hold.unwrap_or_default(), seq), (meta, bytes.clone()));
                    }
                    if hold.is_none() {
                        return Ok(Some(meta));
                    }
                }
            }
        }
    }

    fn update_quiet(&mut self) {
        self.quiet = !self.link_down && self.config.tx.is_none() && self.config.rx.is_none();
    }

    /// Nothing to inject and nothing held: a frame passes unchanged (the common case, which
    /// every frame would otherwise pay the holding queues and the fate draw for).
    fn passes_straight(&self) -> bool {
        self.quiet && self.tx_held.is_empty() && self.rx_held.is_empty()
    }

    /// Changes the fault probabilities (frames already held stay held).
    pub fn set_config(&mut self, config: FaultConfig) {
        self.config = config;
        self.update_quiet();
    }

    /// Takes the link down (every frame sent or received from now on is lost, frames held
    /// for a delay too) or brings it up again.
    pub fn set_link_down(&mut self, down: bool) {
        self.link_down = down;
        self.update_quiet();
    }

    /// The current configuration.
    pub fn config(&self) -> FaultConfig {
        self.config
    }

    /// What the injector has done so far.
    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    fn fate(&mut self, f: DirFaults) -> Fate {
        if self.link_down {
            self.stats.link_down += 1;
            return Fate::Drop;
        }
        if f.is_none() {
            return Fate::Deliver { copies: 1, hold: None, corrupt: false };
        }
        if self.rng.chance(f.drop) {
            self.stats.dropped += 1;
            return Fate::Drop;
        }
        let copies = if self.rng.chance(f.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        let max = if f.delay_max.is_zero() { DEFAULT_REORDER_HOLD } else { f.delay_max };
        let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        let hold = if self.rng.chance(f.delay) {
            self.stats.delayed += 1;
            Some(Duration::from_nanos(self.rng.range_inclusive(1, max_ns)))
        } else if self.rng.chance(f.reorder) {
            self.stats.reordered += 1;
            Some(Duration::from_nanos(
                self.rng.range_inclusive(1, max_ns.min(DEFAULT_REORDER_HOLD.as_nanos() as u64).max(1)),
            ))
        } else {
            None
        };
        let corrupt = self.rng.chance(f.corrupt);
        if corrupt {
            self.stats.corrupted += 1;
        }
        Fate::Deliver { copies, hold, corrupt }
    }

    fn flip_bit(&mut self, frame: &mut [u8]) {
        if frame.is_empty() {
            return;
        }
        let bit = self.rng.below(frame.len() as u64 * 8);
        if let Some(b) = frame.get_mut((bit / 8) as usize) {
            *b ^= 1 << (bit % 8);
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Sends held transmit frames whose time has come.
    fn release_tx(&mut self, now: Instant) -> io::Result<()> {
        while let Some(entry) = self.tx_held.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (dst, bytes) = entry.remove();
            if self.link_down {
                self.stats.link_down += 1;
                continue;
            }
            self.inner.send(now, dst, &bytes)?;
        }
        Ok(())
    }
}

impl Wire for FaultyWire {
    fn local_ip(&self) -> Ipv4Addr {
        self.inner.local_ip()
    }

    fn udp_port(&self) -> u16 {
        self.inner.udp_port()
    }

    fn prepare_to_sleep(&mut self) -> bool {
        self.inner.prepare_to_sleep()
    }

    fn awake(&mut self) {
        self.inner.awake();
    }

    fn rx_pending(&self) -> bool {
        !self.rx_held.is_empty() || !self.tx_held.is_empty() || self.inner.rx_pending()
    }

    fn immediate_route(&self, dst: Ipv4Addr) -> bool {
        // With faults on, frames are held and released frame by frame in `progress`.
        self.passes_straight() && self.inner.immediate_route(dst)
    }

    fn close_same_host(&mut self) {
        self.inner.close_same_host();
    }

    fn ring_stats(&self) -> super::wire::RingStats {
        self.inner.ring_stats()
    }

    fn socket_frames(&self) -> Option<u64> {
        self.inner.socket_frames()
    }

    fn send(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()> {
        if self.passes_straight() {
            return self.inner.send(now, dst, frame);
        }
        self.release_tx(now)?;
        match self.fate(self.config.tx) {
            Fate::Drop => Ok(()),
            Fate::Deliver { copies: 1, hold: None, corrupt: false } => self.inner.send(now, dst, frame),
            Fate::Deliver { copies, hold, corrupt } => {
                let mut bytes = frame.to_vec();
                if corrupt {
                    self.flip_bit(&mut bytes);
                }
                for _ in 0..copies {
                    match hold {
                        Some(d) => {
                            let seq = self.next_seq();
                            self.tx_held.insert((now + d, seq), (dst, bytes.clone()));
                        }
                        None => self.inner.send(now, dst, &bytes)?,
                    }
                }
                Ok(())
            }
        }
    }

    fn send_segments(&mut self, now: Instant, dst: Ipv4Addr, frames: &[u8], seg: usize) -> io::Result<()> {
        self.release_tx(now)?;
        if self.config.tx.is_none() && !self.link_down {
            return self.inner.send_segments(now, dst, frames, seg);
        }
        for frame in frames.chunks(seg.max(1)) {
            self.send(now, dst, frame)?;
        }
        Ok(())
    }

    fn send_unsealed(
        &mut self,
        now: Instant,
        dst: Ipv4Addr,
        frames: &mut [u8],
        seg: usize,
    ) -> io::Result<()> {
        if self.passes_straight() {
            return self.inner.send_unsealed(now, dst, frames, seg);
        }
        // Faults apply to frames as on a link: sealed, so that a corrupted one is caught.
        super::wire::seal_and_send(self, now, dst, frames, seg)
    }

    fn recv(&mut self, now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>> {
        if self.passes_straight() {
            return self.inner.recv(now, buf);
        }
        self.recv_with_faults(now, buf)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        self.inner.raw_fd()
    }

    fn virtual_clock(&self) -> bool {
        self.inner.virtual_clock()
    }

    fn readable(&mut self) {
        self.inner.readable();
    }

    fn local_peer(&self) -> Option<super::place::LocalPeer> {
        self.inner.local_peer()
    }

    fn lookup_peer(&self, ip: Ipv4Addr) -> Option<super::place::LocalPeer> {
        self.inner.lookup_peer(ip)
    }

    fn next_deadline(&self) -> Option<Instant> {
        let held = Instant::min_deadline(
            self.tx_held.keys().next().map(|k| k.0),
            self.rx_held.keys().next().map(|k| k.0),
        );
        Instant::min_deadline(held, self.inner.next_deadline())
    }
}

#[cfg(test)]
mod tests {
    use super::super::sim::SimNet;
    use super::*;

    fn pair(cfg: FaultConfig, seed: u64) -> (FaultyWire, Box<dyn Wire>, Ipv4Addr) {
        let net = SimNet::new(9, Duration::ZERO);
        let a = Ipv4Addr::new(10, 0, 0, 1);
        let b = Ipv4Addr::new(10, 0, 0, 2);
        (FaultyWire::new(Box::new(net.attach(a)), cfg, seed), Box::new(net.attach(b)), b)
    }

    fn drain(w: &mut dyn Wire, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        while let Some(r) = w.recv(now, &mut buf).unwrap() {
            out.push(buf[..r.len].to_vec());
        }
        out
    }

    #[test]
    fn no_faults_is_a_passthrough() {
        let (mut a, mut b, dst) = pair(FaultConfig::NONE, 1);
        for i in 0..100u8 {
            a.send(Instant::ZERO, dst, &[i]).unwrap();
        }
        let got = drain(b.as_mut(), Instant::ZERO);
        assert_eq!(got, (0..100u8).map(|i| vec![i]).collect::<Vec<_>>());
    }

    #[test]
    fn drop_rate_is_roughly_as_configured_and_reproducible() {
        let cfg = FaultConfig { tx: DirFaults::lossy(0.2), rx: DirFaults::NONE };
        let run = |seed| {
            let (mut a, mut b, dst) = pair(cfg, seed);
            for i in 0..1000u32 {
                a.send(Instant::ZERO, dst, &i.to_le_bytes()).unwrap();
            }
            drain(b.as_mut(), Instant::ZERO)
        };
        let first = run(5);
        assert!((700..900).contains(&first.len()), "{}", first.len());
        assert_eq!(first, run(5), "same seed, same losses");
        assert_ne!(first, run(6));
    }

    #[test]
    fn reorder_duplicate_delay_and_corrupt() {
        let f = DirFaults {
            duplicate: 0.3,
            reorder: 0.3,
            delay: 0.1,
            delay_max: Duration::from_micros(50),
            corrupt: 0.1,
            ..DirFaults::NONE
        };
        let (mut a, mut b, dst) = pair(FaultConfig { tx: f, rx: DirFaults::NONE }, 3);
        for i in 0..200u32 {
            a.send(Instant::from_micros(u64::from(i)), dst, &i.to_be_bytes()).unwrap();
        }
        // Held frames go out once their time passes.
        assert!(a.next_deadline().is_some());
        a.recv(Instant::from_secs(1), &mut [0u8; 8]).unwrap();
        let got = drain(b.as_mut(), Instant::from_secs(1));
        let s = a.stats();
        assert!(s.duplicated > 0 && s.reordered > 0 && s.delayed > 0 && s.corrupted > 0, "{s:?}");
        assert_eq!(got.len() as u64, 200 + s.duplicated);
        let in_order = got.windows(2).all(|w| w[0] <= w[1]);
        assert!(!in_order, "some frames were overtaken");
    }
}
