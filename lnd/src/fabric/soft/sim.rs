//! The simulated wire: an in-process network of software devices on a virtual clock.
//!
//! A [`SimNet`] connects any number of [`SimPort`]s by IPv4 address. A frame sent at `now`
//! becomes receivable at `now + latency` plus jitter drawn from the net's seeded generator.
//! Like a real path, each (source, destination) link is FIFO: jitter varies the delay but never
//! lets a frame overtake an earlier one on the same link (reordering is a fault, injected by
//! [`super::fault`]). Frames to an address nobody attached vanish, as on a real network. Nothing here reads a
//! clock: whoever drives the simulation advances `now` to the earliest deadline any device
//! reports. Given the same seed and the same sequence of calls a run is identical, so a failing
//! run is replayed from the seed it printed.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::packet::ROCEV2_UDP_PORT;
use super::place::LocalPeer;
use super::wire::{Received, Wire};
use crate::rng::Rng;
use crate::time::Instant;

#[derive(Debug)]
struct Frame {
    src: Ipv4Addr,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct Inner {
    latency: Duration,
    jitter: Duration,
    rng: Rng,
    seq: u64,
    /// Per destination: frames ordered by (arrival time, sequence).
    inboxes: HashMap<Ipv4Addr, BTreeMap<(Instant, u64), Frame>>,
    /// Arrival time of the last frame on each (source, destination) link.
    last_arrival: HashMap<(Ipv4Addr, Ipv4Addr), Instant>,
    frames_sent: u64,
    frames_lost: u64,
}

/// An in-process network with a one-way latency and optional jitter.
#[derive(Clone, Debug)]
pub struct SimNet {
    inner: Arc<Mutex<Inner>>,
    seed: u64,
}

impl SimNet {
    /// A network whose randomness (jitter, and the seeds it hands to fault injectors) is
    /// determined by `seed`.
    pub fn new(seed: u64, latency: Duration) -> SimNet {
        SimNet {
            inner: Arc::new(Mutex::new(Inner {
                latency,
                jitter: Duration::ZERO,
                rng: Rng::new(seed),
                seq: 0,
                inboxes: HashMap::new(),
                last_arrival: HashMap::new(),
                frames_sent: 0,
                frames_lost: 0,
            })),
            seed,
        }
    }

    /// Adds up to `jitter` of uniformly random extra delay to every frame (links stay FIFO).
    pub fn with_jitter(self, jitter: Duration) -> SimNet {
        self.lock().jitter = jitter;
        self
    }

    /// The seed this network was created with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches a port with address `ip`. Attaching an address twice replaces the inbox.
    pub fn attach(&self, ip: Ipv4Addr) -> SimPort {
        self.lock().inboxes.insert(ip, BTreeMap::new());
        SimPort { net: self.clone(), ip }
    }

    /// Detaches `ip`: frames in flight to it and later frames vanish (a crashed host).
    pub fn detach(&self, ip: Ipv4Addr) {
        self.lock().inboxes.remove(&ip);
    }

    /// The earliest arrival time of any frame in flight.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.lock().inboxes.values().filter_map(|b| b.keys().next().map(|k| k.0)).min()
    }

    /// (frames sent, frames that found no attached destination).
    pub fn counters(&self) -> (u64, u64) {
        let inner = self.lock();
        (inner.frames_sent, inner.frames_lost)
    }
}

/// One attachment to a [`SimNet`].
#[derive(Debug)]
pub struct SimPort {
    net: SimNet,
    ip: Ipv4Addr,
}

impl Wire for SimPort {
    fn local_ip(&self) -> Ipv4Addr {
        self.ip
    }

    fn udp_port(&self) -> u16 {
        ROCEV2_UDP_PORT
    }

    fn send(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()> {
        let mut inner = self.net.lock();
        inner.frames_sent += 1;
        let jitter = if inner.jitter.is_zero() {
            Duration::ZERO
        } else {
            let max = u64::try_from(inner.jitter.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(inner.rng.below(max.saturating_add(1)))
        };
        let src = self.ip;
        let earliest = inner.last_arrival.get(&(src, dst)).copied().unwrap_or(Instant::ZERO);
        let at = (now + inner.latency + jitter).max(earliest);
        inner.last_arrival.insert((src, dst), at);
        inner.seq += 1;
        let seq = inner.seq;
        match inner.inboxes.get_mut(&dst) {
            Some(inbox) => {
                inbox.insert((at, seq), Frame { src, bytes: frame.to_vec() });
            }
            None => inner.frames_lost += 1,
        }
        Ok(())
    }

    fn recv(&mut self, now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>> {
        let mut inner = self.net.lock();
        let Some(inbox) = inner.inboxes.get_mut(&self.ip) else {
            return Ok(None);
        };
        let due = inbox.first_key_value().is_some_and(|(k, _)| k.0 <= now);
        if !due {
            return Ok(None);
        }
        let Some((_, frame)) = inbox.pop_first() else {
            return Ok(None);
        };
        let len = frame.bytes.len().min(buf.len());
        if let (Some(dst), Some(src)) = (buf.get_mut(..len), frame.bytes.get(..len)) {
            dst.copy_from_slice(src);
        }
        Ok(Some(Received::single(frame.src, ROCEV2_UDP_PORT, len)))
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn virtual_clock(&self) -> bool {
        true
    }

    fn next_deadline(&self) -> Option<Instant> {
        let inner = self.net.lock();
        inner.inboxes.get(&self.ip).and_then(|b| b.keys().next().map(|k| k.0))
    }

    fn local_peer(&self) -> Option<LocalPeer> {
        Some(sim_peer(self.ip))
    }

    fn lookup_peer(&self, ip: Ipv4Addr) -> Option<LocalPeer> {
        self.net.lock().inboxes.contains_key(&ip).then(|| sim_peer(ip))
    }
}

/// Every simulated port lives in this process; its nonce is derived from its address.
fn sim_peer(ip: Ipv4Addr) -> LocalPeer {
    LocalPeer {
        pid: std::process::id(),
        nonce: 0x51_0000_0000 | u64::from(u32::from(ip)),
        arena: lnet_shim::arena::arena().map(|a| a.info()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_arrive_after_the_latency_in_order() {
        let net = SimNet::new(1, Duration::from_micros(10));
        let a = Ipv4Addr::new(10, 0, 0, 1);
        let b = Ipv4Addr::new(10, 0, 0, 2);
        let mut pa = net.attach(a);
        let mut pb = net.attach(b);
        let t0 = Instant::from_micros(100);
        pa.send(t0, b, b"one").unwrap();
        pa.send(t0, b, b"two").unwrap();
        pa.send(t0, Ipv4Addr::new(10, 0, 0, 9), b"lost").unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(pb.recv(t0, &mut buf).unwrap(), None);
        assert_eq!(pb.next_deadline(), Some(Instant::from_micros(110)));
        let now = Instant::from_micros(110);
        let r = pb.recv(now, &mut buf).unwrap().unwrap();
        assert_eq!((r.src, &buf[..r.len]), (a, &b"one"[..]));
        let r = pb.recv(now, &mut buf).unwrap().unwrap();
        assert_eq!(&buf[..r.len], b"two");
        assert_eq!(pb.recv(now, &mut buf).unwrap(), None);
        assert_eq!(net.counters(), (3, 1));
    }

    #[test]
    fn jitter_varies_delay_but_links_stay_fifo() {
        let net = SimNet::new(7, Duration::from_micros(10)).with_jitter(Duration::from_micros(50));
        let a = Ipv4Addr::new(10, 0, 0, 1);
        let b = Ipv4Addr::new(10, 0, 0, 2);
        let mut pa = net.attach(a);
        let mut pb = net.attach(b);
        for i in 0..200u32 {
            pa.send(Instant::from_nanos(u64::from(i) * 100), b, &i.to_be_bytes()).unwrap();
        }
        let mut buf = [0u8; 4];
        let mut got = Vec::new();
        while let Some(r) = pb.recv(Instant::from_secs(1), &mut buf).unwrap() {
            got.push(u32::from_be_bytes(buf[..r.len].try_into().unwrap()));
        }
        assert_eq!(got, (0..200).collect::<Vec<_>>());
    }
}
