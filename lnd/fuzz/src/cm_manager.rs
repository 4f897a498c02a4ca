//! `cm_manager`: the CM state machine (`lnd::cm::manager::Cm`) as a consumer of hostile MADs.
//!
//! Two [`Cm`]s, A and B, talk over an in-memory channel that the fuzz input drives one
//! operation at a time ([`Op`]): connects, deliveries, drops, duplicates, reordering, bit flips,
//! forged MADs aimed at live comm IDs, raw byte strings, time steps, and every user call
//! (accept, reject, complete, notify, disconnect, destroy, listen). So the fuzzer reaches every
//! state through the real handshake and then attacks it.
//!
//! Contract checked (the module's "Contract" section):
//! * [`Cm::handle_mad`], [`Cm::handle_timeout`] and the user calls never panic;
//! * every MAD a `Cm` emits decodes ([`CmMad::decode`]);
//! * requests held stay within [`CmConfig::max_pending_requests`];
//! * every event names an id this side created or was told about by a `ConnectRequest`;
//! * **bounded and leak-free**: once the input ends, destroying every id the user knows and
//!   running the timers out leaves no timer armed and no id held ([`Cm::live`] is 0).

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use lnd::cm::ip_cm::{PortSpace, ip_service_id};
use lnd::cm::mad::{CmMad, MAD_LEN, RejReason, attr};
use lnd::cm::{Cm, CmConfig, CmEvent, ConnId, ConnectParams};
use lnd::fabric::{Mad, Mtu, PortAddr};
use lnd::time::Instant;

use crate::Cursor;

/// Side A of the channel.
pub const A: usize = 0;
/// Side B of the channel.
pub const B: usize = 1;
/// The Service ID both sides listen on (rdma_cm TCP port 987, o2iblnd's).
pub const SID: u64 = ip_service_id(PortSpace::Tcp, 987);
/// Most requests a side holds before REJ 3 (small, so floods hit the bound).
pub const MAX_PENDING: usize = 8;
/// MADs in flight before the oldest are dropped.
const INFLIGHT_MAX: usize = 1024;
/// Messages one "deliver all" operation moves at most.
const DELIVER_ALL_MAX: usize = 64;

/// The IPv4 address of a side.
pub fn ip(side: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 1, 1 + side as u8)
}

/// The port address of a side.
pub fn addr(side: usize) -> PortAddr {
    PortAddr::from_ipv4(ip(side))
}

/// An address that is neither side's.
fn stranger() -> PortAddr {
    PortAddr::from_ipv4(Ipv4Addr::new(192, 168, 1, 99))
}

/// The configuration of a side: Linux RoCE defaults with short timers (REQ timer 24 ms, REP
/// timer 16 ms, TIMEWAIT 100 ms) and [`MAX_PENDING`] requests.
pub fn config(side: usize) -> CmConfig {
    CmConfig {
        cm_response_timeout: 12,
        packet_life_time: 10,
        timewait: Duration::from_millis(100),
        max_pending_requests: MAX_PENDING,
        ..CmConfig::roce(addr(side), ip(side), 0x0200_5eff_fe00_0001 + side as u64)
    }
}

/// What `side` asks for when it connects to the other side.
pub fn params(side: usize, qpn: u32, start_psn: u32, service_id: u64) -> ConnectParams {
    let mut private_data = [0u8; 56];
    for (i, b) in private_data.iter_mut().enumerate() {
        *b = 0xc0 ^ i as u8;
    }
    ConnectParams {
        dest: addr(1 - side),
        dest_ip: ip(1 - side),
        src_port: 1023,
        service_id,
        qpn,
        start_psn,
        path_mtu: Mtu::Mtu1024,
        retry_count: 5,
        rnr_retry_count: 6,
        responder_resources: 0,
        initiator_depth: 0,
        local_ack_timeout: 17,
        private_data,
    }
}

/// One operation of the input language (the first byte of each operation, modulo
/// [`Op::COUNT`]; operands follow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// `side qpn:u16 psn:u16 flags`: `side` connects to the other side (flags bit 0: to a
    /// Service ID nobody listens on).
    Connect = 0,
    /// Delivers the oldest MAD in flight.
    Deliver = 1,
    /// Delivers up to 64 MADs.
    DeliverAll = 2,
    /// Drops the oldest MAD in flight.
    Drop = 3,
    /// Duplicates the oldest MAD in flight.
    Duplicate = 4,
    /// Swaps the two oldest MADs in flight.
    Swap = 5,
    /// `index xor`: flips bits of the oldest MAD in flight, then delivers it.
    Corrupt = 6,
    /// `side len:u16 bytes`: hands `len % 320` raw bytes to `side`.
    InjectRaw = 7,
    /// `side attr pick body[232]`: a MAD with a valid CM header, the attribute chosen by `attr`,
    /// the class data from the input, and (per `pick`) comm IDs of a live connection of the
    /// receiver, as its peer would address it.
    InjectForged = 8,
    /// `ms`: advances the clock by `ms` milliseconds and runs both sides' timers.
    Advance = 9,
    /// Jumps to the earliest armed timer and runs it.
    NextTimer = 10,
    /// `side index action args`: a user call on a known id of `side` (see [`user_call`]).
    User = 11,
}

impl Op {
    /// Number of operations.
    pub const COUNT: u8 = 12;
}

/// The two CMs and the channel between them.
pub struct Net {
    /// The virtual clock.
    pub now: Instant,
    /// A and B.
    pub cms: [Cm; 2],
    /// MADs sent and not yet delivered: (sender, bytes).
    pub inflight: VecDeque<(usize, Mad)>,
    /// Ids each side's user knows: returned by `connect` or reported by `ConnectRequest`.
    pub known: [Vec<ConnId>; 2],
    /// Every MAD either side emitted, in order (the seed generator keeps them).
    pub wire: Vec<Mad>,
}

impl Default for Net {
    fn default() -> Self {
        Net::new()
    }
}

impl Net {
    /// Two fresh CMs, both listening on [`SID`].
    pub fn new() -> Net {
        let mut cms = [Cm::new(config(A), 0xa11ce), Cm::new(config(B), 0xb0b)];
        for cm in &mut cms {
            cm.listen(SID);
        }
        Net {
            now: Instant::ZERO,
            cms,
            inflight: VecDeque::new(),
            known: [Vec::new(), Vec::new()],
            wire: Vec::new(),
        }
    }

    /// Moves what both sides emitted into the channel and collects their events, checking each.
    pub fn pump(&mut self) {
        for side in [A, B] {
            while let Some((dest, mad)) = self.cms[side].poll_transmit() {
                if let Err(e) = CmMad::decode(&mad) {
                    panic!("side {side} emitted an undecodable MAD ({e}): {mad:02x?}");
                }
                self.wire.push(mad);
                // Answers to forged MADs from a stranger go nowhere.
                if dest == addr(1 - side) {
                    if self.inflight.len() >= INFLIGHT_MAX {
                        self.inflight.pop_front();
                    }
                    self.inflight.push_back((side, mad));
                }
            }
            while let Some(ev) = self.cms[side].poll_event() {
                let id = ev.id();
                if let CmEvent::ConnectRequest { .. } = ev {
                    assert!(!self.known[side].contains(&id), "side {side}: {id} reported twice as new");
                    self.known[side].push(id);
                } else {
                    assert!(
                        self.known[side].contains(&id),
                        "side {side}: event for an id never known: {ev:?}"
                    );
                }
            }
            let pending = self.cms[side].pending_requests();
            assert!(pending <= MAX_PENDING, "side {side} holds {pending} requests");
        }
    }

    /// `side` connects to the other side (the id joins the known ones).
    pub fn connect(&mut self, side: usize, qpn: u32, start_psn: u32, service_id: u64) -> Option<ConnId> {
        let id = self.cms[side].connect(self.now, params(side, qpn, start_psn, service_id)).ok()?;
        self.known[side].push(id);
        Some(id)
    }

    /// Delivers the oldest MAD in flight, if any.
    pub fn deliver(&mut self) -> bool {
        match self.inflight.pop_front() {
            Some((from, mad)) => {
                self.cms[1 - from].handle_mad(self.now, addr(from), &mad);
                true
            }
            None => false,
        }
    }

    /// Delivers until the channel is empty (bounded), pumping after each MAD.
    pub fn settle(&mut self) {
        for _ in 0..10_000 {
            self.pump();
            if !self.deliver() {
                return;
            }
        }
    }

    /// Runs both sides' timers at `now`.
    pub fn timers(&mut self) {
        for cm in &mut self.cms {
            cm.handle_timeout(self.now);
        }
    }

    /// Runs one operation from the input.
    pub fn step(&mut self, c: &mut Cursor<'_>) {
        match c.u8() % Op::COUNT {
            0 => {
                let side = usize::from(c.u8() & 1);
                let qpn = u32::from(c.u16()) + 2;
                let psn = u32::from(c.u16());
                let sid = if c.u8() & 1 == 0 { SID } else { ip_service_id(PortSpace::Tcp, 988) };
                self.connect(side, qpn, psn, sid);
            }
            1 => {
                self.deliver();
            }
            2 => {
                for _ in 0..DELIVER_ALL_MAX {
                    if !self.deliver() {
                        break;
                    }
                    self.pump();
                }
            }
            3 => {
                self.inflight.pop_front();
            }
            4 => {
                if let Some(&m) = self.inflight.front() {
                    self.inflight.push_back(m);
                }
            }
            5 => {
                if self.inflight.len() >= 2 {
                    self.inflight.swap(0, 1);
                }
            }
            6 => {
                let (i, x) = (c.u8(), c.u8() | 1);
                if let Some((_, mad)) = self.inflight.front_mut() {
                    mad[usize::from(i)] ^= x;
                }
                self.deliver();
            }
            7 => {
                let side = usize::from(c.u8() & 1);
                let len = usize::from(c.u16() % 320);
                let bytes = c.bytes(len);
                self.cms[side].handle_mad(self.now, addr(1 - side), bytes);
            }
            8 => {
                let side = usize::from(c.u8() & 1);
                let attr_sel = c.u8();
                let pick = c.u8();
                let mad = self.forge(side, attr_sel, pick, c.bytes(MAD_LEN - 24));
                let from = if pick & 0x80 == 0 { addr(1 - side) } else { stranger() };
                self.cms[side].handle_mad(self.now, from, &mad);
            }
            9 => {
                let ms = u64::from(c.u8());
                self.now += Duration::from_millis(ms * ms / 8);
                self.timers();
            }
            10 => {
                let next = Instant::min_deadline(self.cms[A].poll_timeout(), self.cms[B].poll_timeout());
                if let Some(t) = next {
                    self.now = self.now.max(t);
                    self.timers();
                }
            }
            _ => {
                let side = usize::from(c.u8() & 1);
                let index = usize::from(c.u8());
                let action = c.u8();
                let arg = c.u16();
                self.user_call(side, index, action, arg);
            }
        }
        self.pump();
    }

    /// A MAD with a valid CM header for the attribute `attr_sel` picks and `body` as class data;
    /// `pick` decides whether (and which) live connection of `side` the comm IDs address.
    fn forge(&self, side: usize, attr_sel: u8, pick: u8, body: &[u8]) -> Mad {
        const ATTRS: [u16; 9] = [
            attr::REQ,
            attr::REP,
            attr::RTU,
            attr::REJ,
            attr::MRA,
            attr::DREQ,
            attr::DREP,
            attr::LAP,
            0x0042,
        ];
        let attr_id = ATTRS[usize::from(attr_sel) % ATTRS.len()];
        let mut mad = [0u8; MAD_LEN];
        mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        mad[8..16].copy_from_slice(&u64::from(attr_sel).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
        mad[16..18].copy_from_slice(&attr_id.to_be_bytes());
        mad[24..24 + body.len()].copy_from_slice(body);
        let known = &self.known[side];
        if pick & 0x40 != 0 && !known.is_empty() {
            // Address the id as its peer would: our id is their "remote", theirs is "local".
            // Ids of one connection sit at about the same index on both sides.
            let i = usize::from(pick & 0x3f);
            let mine = known[i % known.len()];
            mad[28..32].copy_from_slice(&mine.0.to_be_bytes());
            let theirs = &self.known[1 - side];
            if !theirs.is_empty() {
                mad[24..28].copy_from_slice(&theirs[i % theirs.len()].0.to_be_bytes());
            }
        }
        mad
    }

    /// A user call on id number `index` (modulo) that `side` knows: `action % 8` picks accept,
    /// reject, complete_connect, notify_comm_est, disconnect, destroy, or unlisten/listen.
    pub fn user_call(&mut self, side: usize, index: usize, action: u8, arg: u16) {
        let now = self.now;
        let Some(&id) = self.known[side].get(index % self.known[side].len().max(1)) else {
            return;
        };
        let cm = &mut self.cms[side];
        // Up to 199 bytes: more than a REP (196) or a REJ (148) carries, so both refusals run.
        let pd = [0x5au8; 200];
        let pd = &pd[..usize::from(arg % 200)];
        // Errors (unknown id, wrong state, too much private data) are the caller's, not a panic.
        let _ = match action % 8 {
            0 => cm.accept(now, id, u32::from(arg) + 2, u32::from(arg) << 4, (action >> 3) & 7, pd),
            1 => cm.reject(now, id, RejReason::from_u16(arg % 40), pd),
            2 => cm.complete_connect(now, id),
            3 => {
                cm.notify_comm_est(now, id);
                Ok(())
            }
            4 => cm.disconnect(now, id),
            5 => {
                cm.destroy(now, id);
                Ok(())
            }
            6 => {
                cm.unlisten(SID);
                Ok(())
            }
            _ => {
                cm.listen(SID);
                Ok(())
            }
        };
    }

    /// Destroys every id the users know and runs the timers out; checks nothing is left.
    pub fn wind_down(&mut self) {
        for side in [A, B] {
            for id in std::mem::take(&mut self.known[side]) {
                self.cms[side].destroy(self.now, id);
            }
            let cm = &mut self.cms[side];
            for _ in 0..10_000 {
                while cm.poll_transmit().is_some() {}
                if let Some(ev) = cm.poll_event() {
                    panic!("side {side}: event after every id was destroyed: {ev:?}");
                }
                let Some(t) = cm.poll_timeout() else { break };
                cm.handle_timeout(t);
            }
            assert_eq!(cm.poll_timeout(), None, "side {side}: a timer outlived every id");
            assert_eq!(cm.live(), 0, "side {side}: ids held after every known id was destroyed");
        }
    }
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let mut net = Net::new();
    let mut c = Cursor::new(data);
    while !c.is_empty() {
        net.step(&mut c);
    }
    net.wind_down();
}
