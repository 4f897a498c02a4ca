//! The software RC device: an HCA in software that a verbs programmer would recognise.
//!
//! [`SoftDevice`] implements [`crate::fabric::Device`] with RoCEv2 framing (BTH, RETH, AETH,
//! DETH, ImmDt, ICRC; [`packet`]) over a [`wire::Wire`]: real UDP sockets on port 4791
//! ([`SoftDevice::open_udp`]) or the in-process simulated wire ([`SoftDevice::open_sim`]).
//!
//! What it emulates:
//! * the RC transport of IBTA (per-QP PSNs, cumulative ACKs, sequence NAKs, go-back-N on
//!   timeout, retry and RNR counters, duplicate suppression, ordered completions, flush on
//!   error; see [`rc`]);
//! * memory protection (key, PD, access flags and range checked before a byte is written;
//!   [`mem`]);
//! * the GSI: 256-byte MADs to and from QP1 as UD SEND ONLY packets with Q_Key 0x80010000;
//! * `COMM_EST`, `QP_FATAL` and `CQ_ERR` async events, and `PORT_ERR`, `PORT_ACTIVE` and
//!   `DEVICE_FATAL` when a test takes the link down or fails the device
//!   ([`SoftDevice::set_port_state`], [`SoftDevice::inject_device_fatal`]);
//! * device limits: max QPs, WRs per queue, SGEs, CQEs, MRs, and a total work-queue-entry
//!   budget (the HCA's memory), so QP creation fails with [`FabricError::Resource`] and
//!   succeeds when retried smaller;
//! * seeded fault injection per direction ([`fault`]);
//! * the **same-host single-copy path** ([`place`]): an RDMA WRITE to a port on the same host
//!   (loopback addresses; every port of a [`SimNet`]) travels as one small vendor request in
//!   the RC stream, and the responder, after the usual key/PD/access/range check under its
//!   lock, copies the payload once from the requester's process straight into its registered
//!   memory: a `memcpy` from the requester's buffer arena, which it maps read-only
//!   ([`peer_arena`]), or else one `process_vm_readv`. Peers find each other's process through
//!   a per-user registry ([`registry`]), never through a packet; a kernel refusal (`EPERM`,
//!   e.g. Yama) falls back to the wire for that peer. A liveness word per placed request
//!   (`live`) keeps a responder that runs late from copying a buffer the requester already
//!   reused. It is the default;
//!   [`SoftConfig::single_copy`] or `LND_SOFT_SINGLE_COPY=0|syscall|1` choose the path;
//!   `FabricStats::placed_*` count it. On the same path every other frame to a same-host port
//!   travels through a shared-memory ring with a UDP doorbell for a sleeping consumer
//!   ([`ring`]). Large copies are shared with a helper thread ([`copier`]) and, once the
//!   memory recently written outgrows the cache, use streaming stores ([`streaming`]).
//!
//! What it does not: RDMA READ and atomics, UD QPs beyond the GSI, SRQs, memory windows,
//! P_Key tables, multiple ports, congestion control (CNPs are ignored).
//!
//! Progress is poll-driven: posting only queues work; [`crate::fabric::Device::progress`]
//! transmits what was posted, receives frames, runs the transport and timers, and transmits
//! what they made. [`crate::fabric::Device::progress_receive`] (the engine's first half-poll)
//! keeps the ACK of a single SEND for the next call, so the reply posted in between carries
//! it. The one exception to "posting only queues" is the doorbell of
//! [`crate::fabric::QueuePair::post_send_at`]: to a destination behind a same-host ring
//! (nothing to batch) the device transmits at once, with `now` from the caller. The protocol
//! never reads a clock (`now` is an argument) and runs on the caller's thread; the one thread
//! the device starts is its copy engine's helper ([`copier`]), which only copies the bytes of
//! placed WRITEs: shared with the `progress` call that makes the copy, or, for one large copy
//! at a time, alone while the device returns to its caller; the next `progress` concludes
//! that copy before it receives anything else. The helper parks when idle.

mod batch;
mod config;
pub mod copier;
pub use copier::CopyHelper;
pub mod cq;
pub mod fault;
pub(crate) mod live;
pub mod mem;
mod objects;
pub mod packet;
pub mod peer_arena;
pub mod place;
pub mod rc;
pub mod registry;
pub mod ring;
pub mod sim;
pub mod streaming;
pub use streaming::Streaming;
pub mod wire;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use lnet_shim::hash::FastMap;

use self::wire::Received;
pub use cq::SoftCq;
pub use fault::{DirFaults, FaultConfig, FaultStats};
pub use place::{LocalPeer, SingleCopy};
pub use sim::{SimNet, SimPort};
pub use wire::{UdpWire, Wire};

use self::batch::TxBatch;
pub(crate) use self::config::setting_from_env;
pub use self::config::{SoftConfig, SoftLimits};
pub use self::objects::{SoftMr, SoftPd, SoftQp};

use self::cq::CqShared;
use self::fault::FaultyWire;
use self::mem::MrTable;
use self::packet::{Bth, Deth, Headers, IcrcMeta, Opcode, PacketError};
use self::place::Placement;
use self::rc::{Completion, CqSel, PlaceCtx, RcQp};
use crate::fabric::{
    Access, AsyncEvent, Device, DeviceAttr, FabricError, FabricStats, Mad, Mtu, PortAddr, PortAttr,
    PortState, QpCaps, QpInitAttr, QpState,
};
use crate::rng::Rng;
use crate::time::Instant;

/// Frames received per `progress` call before yielding (the rest stay queued).
const RX_BATCH: usize = 512;
/// Frames transmitted per `progress` call before yielding.
const TX_BATCH: usize = 512;
/// Frames one QP sends before the next ready QP gets a turn.
const QP_BURST: usize = 32;
/// MADs queued for the CM before further ones are dropped (a REQ flood costs nothing more).
const GSI_QUEUE_MAX: usize = 4096;
/// Async events kept before the oldest are dropped.
const EVENT_QUEUE_MAX: usize = 4096;
/// Largest frame: BTH + RETH + ImmDt + 4096 payload + pad + ICRC, rounded up.
const MAX_FRAME: usize = 4096 + 128;
/// Receive buffer: room for a UDP GRO batch of coalesced frames.
const RX_BUFFER: usize = 65_536 + MAX_FRAME;

struct QpEntry {
    rc: RcQp,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    wqes: u64,
    in_ready: bool,
    /// The time of this QP's live entry in `DevState::timers` (others are stale); never later
    /// than the transport's deadline.
    timer: Option<Instant>,
}

struct DevState {
    wire: FaultyWire,
    mrs: MrTable,
    /// Boxed: [`SoftQp::with`] takes an entry out of the table and puts it back.
    qps: FastMap<u32, Box<QpEntry>>,
    next_qpn: u32,
    pds: u32,
    next_pd: u32,
    cqs: Vec<Weak<CqShared>>,
    next_cq: u32,
    wqe_used: u64,
    rng: Rng,
    ready: VecDeque<u32>,
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    gsi_rx: VecDeque<(PortAddr, Mad)>,
    gsi_tx: VecDeque<(Ipv4Addr, Mad)>,
    gsi_psn: u32,
    events: VecDeque<AsyncEvent>,
    stats: FabricStats,
    place: Placement,
    batch: TxBatch,
    rx_buf: Vec<u8>,
    scratch: Vec<Completion>,
    scratch_events: Vec<AsyncEvent>,
    /// Completion channels signalled since [`Device::take_signalled_cqs`] last took them
    /// (kept only once someone has asked, so that a user who never does accumulates nothing).
    signalled: Vec<RawFd>,
    signalled_wanted: bool,
    more_rx: bool,
    /// The QP whose placement request's copy runs on the copy engine ([`copier`]). While it
    /// does, no frame is received: the next `progress` concludes it first (waiting for it,
    /// or copying what is left), so RC ordering is that of a copy made on the spot.
    placing_qp: Option<u32>,
    /// The rest of a received batch of frames (UDP GRO) left when a copy started running:
    /// the batch and the offset of its next frame, still in `rx_buf`.
    rx_resume: Option<(Received, usize)>,
    /// The port's state ([`SoftDevice::set_port_state`]).
    port_state: PortState,
    /// The device failed ([`SoftDevice::inject_device_fatal`]): the port stays down.
    fatal: bool,
}

struct Shared {
    name: String,
    attr: DeviceAttr,
    port: PortAttr,
    ip: Ipv4Addr,
    udp_port: u16,
    limits: SoftLimits,
    max_inflight: u32,
    fd: Option<RawFd>,
    state: Mutex<DevState>,
    /// What the engine asks on every turn, published whenever the lock is let go, so that it
    /// can be read without taking the lock ([`Published`]).
    published: Published,
}

/// A few facts about [`DevState`] kept outside its lock: every [`Shared::lock`] guard stores
/// them as it lets go, so they are never older than the last unlock.
#[derive(Default)]
struct Published {
    /// `tx_packets + rx_packets` ([`Device::packets`]).
    packets: AtomicU64,
    /// MADs are waiting ([`Device::recv_mad`]).
    mads: AtomicBool,
    /// Async events are waiting ([`Device::poll_async_event`]).
    events: AtomicBool,
    /// Signalled completion channels are waiting ([`Device::take_signalled_cqs`]).
    signalled: AtomicBool,
    /// `DevState::signalled_wanted`: someone has asked for signalled channels.
    signalled_wanted: AtomicBool,
}

impl Shared {
    fn lock(&self) -> DevGuard<'_> {
        DevGuard { state: self.state.lock().unwrap_or_else(|p| p.into_inner()), published: &self.published }
    }

    /// [`Device::progress`], or with `hold` [`Device::progress_receive`].
    ///
    /// Transmits first: what the caller posted since the last call (with the ACKs waiting
    /// riding on it as a [`packet::PiggyAck`]) and what the last call left. The QPs go before
    /// the GSI: a DREQ the caller sends after seeing a message must not overtake that
    /// message's ACK (the peer would fail the send it closes on). Then it receives, fires
    /// timers and transmits what that made (ACKs, NAKs, retransmits), except, when holding,
    /// on QPs whose only responses are positive ACKs of SENDs
    /// ([`rc::RcQp::must_respond_now`]). Those leave on the next call, which the caller
    /// makes after handling the completions: a reply posted in between (an LNet event
    /// callback answering a request, o2iblnd's PUT_ACK to a PUT_REQ) carries the ACK,
    /// instead of an ACK frame of its own on the round trip ahead of the reply. `work_now`
    /// keeps a caller from sleeping while anything waits.
    fn progress(&self, now: Instant, hold: bool) -> Result<(), FabricError> {
        let (local, port) = (self.ip, self.udp_port);
        let mut s = self.lock();
        let sent = s.transmit_all(now, local, port);
        // A running copy is concluded here, waiting for it if need be, except by the first
        // half of the engine's poll (`hold`), which only takes it when it is done: otherwise
        // that half receives nothing and the completions the caller has already go first,
        // while the copy goes on.
        if !hold || s.place.copy_done() {
            s.conclude_placing(now);
        }
        s.more_rx = false;
        for i in 0..=RX_BATCH {
            if i == RX_BATCH || s.placing_qp.is_some() {
                // A running copy: the caller comes back for it (`work_now`).
                s.more_rx = true;
                break;
            }
            let (r, from) = match s.rx_resume.take() {
                Some(rest) => rest,
                None => {
                    let DevState { wire, rx_buf, .. } = &mut *s;
                    match wire.recv(now, rx_buf) {
                        Ok(Some(r)) => (r, 0),
                        Ok(None) => break,
                        Err(e) => return Err(FabricError::io("recv", e)),
                    }
                }
            };
            // One datagram, or several coalesced by GRO: frames of `seg` bytes.
            let seg = if r.seg == 0 { r.len } else { r.seg };
            let mut at = from;
            while at < r.len {
                if s.placing_qp.is_some() {
                    s.rx_resume = Some((r, at));
                    break;
                }
                let n = seg.min(r.len - at);
                s.handle_frame(now, local, port, &r, at, n);
                at += n;
            }
        }
        s.fire_timers(now);
        let DevState { place, wire, .. } = &mut *s;
        place.forget_departed(wire, now);
        let sent = sent.and_then(|()| s.transmit(now, local, port, hold));
        sent.map_err(|e| FabricError::io("send", e))
    }
}

/// The device lock; publishes [`Published`] before letting go.
struct DevGuard<'a> {
    state: MutexGuard<'a, DevState>,
    published: &'a Published,
}

impl std::ops::Deref for DevGuard<'_> {
    type Target = DevState;
    fn deref(&self) -> &DevState {
        &self.state
    }
}

impl std::ops::DerefMut for DevGuard<'_> {
    fn deref_mut(&mut self) -> &mut DevState {
        &mut self.state
    }
}

impl Drop for DevGuard<'_> {
    fn drop(&mut self) {
        let (s, p) = (&*self.state, self.published);
        p.packets.store(s.stats.tx_packets.wrapping_add(s.stats.rx_packets), Ordering::Release);
        p.mads.store(!s.gsi_rx.is_empty(), Ordering::Release);
        p.events.store(!s.events.is_empty(), Ordering::Release);
        p.signalled.store(!s.signalled.is_empty(), Ordering::Release);
        p.signalled_wanted.store(s.signalled_wanted, Ordering::Release);
    }
}

/// A software RC device port. Cheap to clone (a handle).
#[derive(Clone)]
pub struct SoftDevice {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftDevice").field("name", &self.shared.name).field("ip", &self.shared.ip).finish()
    }
}

/// Live objects on a device (for leak checks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveCounts {
    /// Queue pairs.
    pub qps: usize,
    /// Memory regions.
    pub mrs: u32,
    /// Completion queues.
    pub cqs: usize,
    /// Protection domains.
    pub pds: u32,
    /// Work-queue entries reserved by live QPs.
    pub wqes: u64,
}

impl SoftDevice {
    /// Whether a peer's RDMA WRITE of `len` bytes at `addr` under `rkey` would pass this
    /// device's protection checks in `pd` (tests of what the LND registers).
    #[cfg(test)]
    pub(crate) fn remote_write_allowed(&self, pd: &SoftPd, rkey: u32, addr: u64, len: u64) -> bool {
        self.shared.lock().mrs.check_remote_write(pd.handle, rkey, addr, len).is_ok()
    }

    /// Opens a device whose port is `ip` on real UDP sockets (`ip:udp_port`).
    pub fn open_udp(ip: Ipv4Addr, config: SoftConfig) -> Result<SoftDevice, FabricError> {
        let mut wire = UdpWire::bind(ip, config.udp_port).map_err(|e| {
            FabricError::io(
                "bind RoCEv2 UDP socket",
                std::io::Error::new(e.kind(), format!("{ip}:{}: {e}", config.udp_port)),
            )
        })?;
        if config.single_copy != SingleCopy::Off {
            // Without an entry peers cannot find this process: the wire is used, nothing breaks.
            if let Err(e) = wire.publish(crate::rng::os_seed()) {
                eprintln!("lnd: {}: single-copy off: cannot publish {ip} in the registry: {e}", config.name);
            }
        }
        Ok(SoftDevice::with_wire(Box::new(wire), config))
    }

    /// Withdraws the device from the same-host path: its registry entry and its rings are
    /// removed now rather than when the last handle goes (LNet buffers may keep cached
    /// registrations, and so the device, alive until the process exits). Frames go by UDP
    /// from then on. For a driver shutting down.
    pub fn close_same_host(&self) {
        self.shared.lock().wire.close_same_host();
    }

    /// Opens a device whose port is `ip` on a simulated network.
    pub fn open_sim(net: &SimNet, ip: Ipv4Addr, config: SoftConfig) -> SoftDevice {
        SoftDevice::with_wire(Box::new(net.attach(ip)), config)
    }

    /// Opens a device on any wire.
    pub fn with_wire(wire: Box<dyn Wire>, config: SoftConfig) -> SoftDevice {
        let ip = wire.local_ip();
        let udp_port = wire.udp_port();
        let fd = wire.raw_fd();
        let mut rng = Rng::new(config.seed);
        let fault_seed = rng.next_u64();
        let o = ip.octets();
        let node_guid =
            0x0200_5eff_fe00_0000u64 | u64::from(u32::from_be_bytes(o)) & 0xff_ffff | (u64::from(o[0]) << 32);
        let l = config.limits;
        let attr = DeviceAttr {
            node_guid,
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_sge,
            max_cqe: l.max_cqe,
            max_cq: l.max_cq,
            max_mr_size: l.max_mr_size,
            max_mr: l.max_mr,
            max_pd: l.max_pd,
            max_qp_rd_atom: 0,
            max_inline_data: l.max_inline_data,
        };
        let port = PortAttr {
            port_num: config.port_num,
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: config.mtu,
            addr: config.port_addr.unwrap_or(PortAddr::from_ipv4(ip)),
        };
        let first_qpn = 2 + (rng.next_u32() & 0x7f_ffff);
        let place = Placement::new(
            &config.name,
            config.single_copy,
            wire.local_peer(),
            config.copy_helper,
            config.helper_spin,
            config.streaming,
            wire.virtual_clock(),
        );
        let state = DevState {
            wire: FaultyWire::new(wire, config.faults, fault_seed),
            mrs: MrTable::new(l.max_mr),
            qps: FastMap::default(),
            next_qpn: first_qpn,
            pds: 0,
            next_pd: 1,
            cqs: Vec::new(),
            next_cq: 1,
            wqe_used: 0,
            rng,
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            gsi_rx: VecDeque::new(),
            gsi_tx: VecDeque::new(),
            gsi_psn: 0,
            events: VecDeque::new(),
            stats: FabricStats::default(),
            place,
            batch: TxBatch::default(),
            rx_buf: vec![0u8; RX_BUFFER],
            scratch: Vec::new(),
            scratch_events: Vec::new(),
            signalled: Vec::new(),
            signalled_wanted: false,
            more_rx: false,
            placing_qp: None,
            rx_resume: None,
            port_state: PortState::Active,
            fatal: false,
        };
        SoftDevice {
            shared: Arc::new(Shared {
                name: config.name,
                attr,
                port,
                ip,
                udp_port,
                limits: l,
                max_inflight: config.max_inflight,
                fd,
                state: Mutex::new(state),
                published: Published::default(),
            }),
        }
    }

    /// The port's IPv4 address.
    pub fn ip(&self) -> Ipv4Addr {
        self.shared.ip
    }

    /// Replaces the fault-injection probabilities.
    pub fn set_faults(&self, faults: FaultConfig) {
        self.shared.lock().wire.set_config(faults);
    }

    /// What fault injection has done so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.shared.lock().wire.stats()
    }

    /// Takes the port's link down or brings it back, as pulling and reseating its cable would
    /// (fault injection for tests and drills). Any state but `Active`: every frame either way
    /// is lost from now on (the CM's MADs too), QPs keep their state (RC retries run and fail
    /// when they run out, as on a real link), [`Device::query_port`] reports the state and
    /// [`AsyncEvent::PortErr`] is raised. `Active`: frames flow again and
    /// [`AsyncEvent::PortActive`] is raised. A change between two down states, or to the state
    /// the port is in, raises nothing; a failed device ([`SoftDevice::inject_device_fatal`])
    /// stays down. Whoever polls the device learns of it on its next call: a sleeping
    /// scheduler is not woken.
    pub fn set_port_state(&self, state: PortState) {
        let mut s = self.shared.lock();
        if s.fatal {
            return;
        }
        let (was_up, up) = (s.port_state == PortState::Active, state == PortState::Active);
        s.port_state = state;
        s.wire.set_link_down(!up);
        if was_up != up {
            s.push_event(if up { AsyncEvent::PortActive } else { AsyncEvent::PortErr });
        }
    }

    /// Fails the device, as a firmware fault would (`IBV_EVENT_DEVICE_FATAL`): every QP
    /// moves to ERR (its outstanding work requests complete flushed), the port goes down for
    /// good and [`AsyncEvent::DeviceFatal`] is raised. Objects can still be destroyed; a new
    /// QP is created in a device whose link never comes back.
    pub fn inject_device_fatal(&self) {
        let mut s = self.shared.lock();
        if s.fatal {
            return;
        }
        s.fatal = true;
        s.port_state = PortState::Down;
        s.wire.set_link_down(true);
        let all: Vec<u32> = s.qps.keys().copied().collect();
        s.qps_to_error(&all);
        s.push_event(AsyncEvent::DeviceFatal);
    }

    /// Test hook: the same-host copies of this device (as the responder) fail with `errno`
    /// (`None` restores them), as when the kernel forbids `process_vm_readv`.
    #[doc(hidden)]
    pub fn force_placement_errno(&self, errno: Option<i32>) {
        self.shared.lock().place.force_errno(errno);
    }

    /// How many same-host senders' buffer arenas this device has mapped ([`peer_arena`]).
    pub fn mapped_arenas(&self) -> usize {
        self.shared.lock().place.mapped_arenas()
    }

    /// Live objects, for leak checks.
    pub fn live_counts(&self) -> LiveCounts {
        let mut s = self.shared.lock();
        s.cqs.retain(|w| w.strong_count() > 0);
        LiveCounts { qps: s.qps.len(), mrs: s.mrs.live(), cqs: s.cqs.len(), pds: s.pds, wqes: s.wqe_used }
    }
}

impl DevState {
    /// Work `progress` has left for its next call: frames beyond its batch, sends ready.
    fn work_now(&self) -> bool {
        self.more_rx || !self.ready.is_empty() || !self.gsi_tx.is_empty()
    }

    /// Moves completions and events out of a QP, re-arms its timer, and queues it to transmit
    /// if it has something to send (`now`; `None`: whatever its state).
    fn after_qp(&mut self, qpn: u32, now: Option<Instant>) {
        let Some(e) = self.qps.get_mut(&qpn) else { return };
        if e.rc.has_output() {
            self.move_output(qpn);
        }
        let Some(e) = self.qps.get_mut(&qpn) else { return };
        // A QP's live heap entry is the earliest it armed: a deadline that moved later (the
        // next SEND's retransmission timer after an ACK) keeps that entry, which arms the
        // real deadline when it comes up. A push per change would leave one cancelled entry
        // per message for a whole retransmission timeout (tens of thousands of them at a
        // ping's rate, each push and pop a walk through a heap that big).
        if let Some(t) = e.rc.deadline().filter(|&t| e.timer.is_none_or(|armed| t < armed)) {
            e.timer = Some(t);
            self.timers.push(Reverse((t, qpn)));
        }
        // Ready to transmit: queued once.
        if now.is_none_or(|n| e.rc.wants_transmit(n)) && !e.in_ready {
            e.in_ready = true;
            self.ready.push_back(qpn);
        }
    }

    /// Moves the completions of QP `qpn` to its CQs and its async events to the device's.
    fn move_output(&mut self, qpn: u32) {
        let mut completions = std::mem::take(&mut self.scratch);
        let mut events = std::mem::take(&mut self.scratch_events);
        let mut overrun = Vec::new();
        if let Some(e) = self.qps.get_mut(&qpn) {
            e.rc.take_completions(&mut completions);
            e.rc.take_events(&mut events);
            for c in completions.drain(..) {
                let cq = match c.cq {
                    CqSel::Send => &e.send_cq,
                    CqSel::Recv => &e.recv_cq,
                };
                match cq.push(c.wc, c.solicited) {
                    Ok(true) => {
                        self.stats.cq_notifications += 1;
                        if self.signalled_wanted {
                            self.signalled.push(cq.event_fd());
                        }
                    }
                    Ok(false) => {}
                    Err(_) if !overrun.contains(&cq.id) => overrun.push(cq.id),
                    Err(_) => {}
                }
            }
        }
        for ev in events.drain(..) {
            self.push_event(ev);
        }
        self.scratch = completions;
        self.scratch_events = events;
        for cq_id in overrun {
            self.cq_overrun(cq_id);
        }
    }

    fn push_event(&mut self, ev: AsyncEvent) {
        if self.events.len() >= EVENT_QUEUE_MAX {
            self.events.pop_front();
        }
        self.events.push_back(ev);
    }

    /// A CQ overran: raise CQ_ERR and move every QP using it to ERR.
    fn cq_overrun(&mut self, cq_id: u32) {
        self.push_event(AsyncEvent::CqErr { cq_id });
        let victims: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, e)| e.send_cq.id == cq_id || e.recv_cq.id == cq_id)
            .map(|(q, _)| *q)
            .collect();
        for qpn in self.qps_to_error(&victims) {
            self.push_event(AsyncEvent::QpFatal { qp_num: qpn });
        }
    }

    /// Moves the QPs `qpns` that are not in ERR yet to ERR, flushing what they hold to their
    /// CQs; the ones it moved.
    fn qps_to_error(&mut self, qpns: &[u32]) -> Vec<u32> {
        let mut moved = Vec::new();
        for &qpn in qpns {
            let Some(e) = self.qps.get_mut(&qpn) else { continue };
            if e.rc.state() == QpState::Err {
                continue;
            }
            e.rc.enter_error();
            let mut lost = Vec::new();
            e.rc.take_completions(&mut lost);
            for c in lost {
                let cq = if c.cq == CqSel::Send { &e.send_cq } else { &e.recv_cq };
                let _ = cq.push(c.wc, c.solicited);
            }
            moved.push(qpn);
        }
        moved
    }

    /// Handles the frame at `rx_buf[at..at + len]`, one of what `r` received; an unsealed
    /// one ([`Received::sealed`]) is decoded without the ICRC check.
    fn handle_frame(
        &mut self,
        now: Instant,
        local: Ipv4Addr,
        udp_port: u16,
        r: &Received,
        at: usize,
        len: usize,
    ) {
        let src = r.src;
        let meta = IcrcMeta::new(src, local, r.src_port, udp_port);
        let frame = self.rx_buf.get(at..at + len).unwrap_or_default();
        let parsed = if r.sealed { packet::parse(&meta, frame) } else { packet::parse_unchecked(frame) };
        let pkt = match parsed {
            Ok(p) => p,
            Err(PacketError::BadIcrc { .. }) => {
                self.stats.bad_icrc += 1;
                return;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += len as u64;
        let dqp = pkt.headers.bth.dest_qp;
        if dqp == 1 {
            let ok = pkt.headers.bth.opcode == Opcode::UdSendOnly
                && pkt.headers.deth.is_some_and(|d| d.qkey == packet::GSI_QKEY);
            match <&Mad>::try_from(pkt.payload) {
                Ok(mad) if ok => {
                    self.stats.mads_received += 1;
                    if self.gsi_rx.len() < GSI_QUEUE_MAX {
                        self.gsi_rx.push_back((PortAddr::from_ipv4(src), *mad));
                    }
                }
                _ => self.stats.malformed += 1,
            }
            return;
        }
        let DevState { qps, mrs, stats, place, wire, .. } = self;
        match qps.get_mut(&dqp) {
            Some(e) => {
                let refused = e.rc.place_refused();
                e.rc.on_packet(now, src, &pkt, mrs, stats, &mut PlaceCtx { place, wire });
                if !refused && e.rc.place_refused() {
                    place.refused_by(src);
                }
                if e.rc.is_placing() {
                    self.placing_qp = Some(dqp);
                }
            }
            None => {
                stats.malformed += 1;
                return;
            }
        }
        self.after_qp(dqp, Some(now));
    }

    /// Ends the placement request whose copy runs, if any: waits for the copy (copying what
    /// the helper has not taken), judges it and lets its QP accept or refuse the request.
    fn conclude_placing(&mut self, now: Instant) {
        let Some(qpn) = self.placing_qp.take() else { return };
        let Some(outcome) = self.place.conclude() else { return };
        if let Some(e) = self.qps.get_mut(&qpn) {
            e.rc.conclude_placed(outcome, &mut self.stats);
        }
        self.after_qp(qpn, Some(now));
    }

    fn transmit_gsi(&mut self, now: Instant, local: Ipv4Addr, udp_port: u16) -> std::io::Result<()> {
        while let Some((dst, mad)) = self.gsi_tx.pop_front() {
            let headers = Headers {
                bth: Bth::new(Opcode::UdSendOnly, 1, self.gsi_psn),
                piggy: None,
                deth: Some(Deth { qkey: packet::GSI_QKEY, src_qp: 1 }),
                reth: None,
                aeth: None,
                imm: None,
            };
            self.gsi_psn = packet::psn_add(self.gsi_psn, 1);
            let mut frame = Vec::with_capacity(packet::frame_len(&headers, mad.len()));
            let meta = IcrcMeta::new(local, dst, udp_port, udp_port);
            if packet::build(&meta, &headers, &mad, &mut frame).is_err() {
                continue;
            }
            self.stats.mads_sent += 1;
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += frame.len() as u64;
            match self.wire.send(now, dst, &frame) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Everything waiting: the QPs' frames, then the GSI's (a DREQ never overtakes the ACK of
    /// the message before it).
    fn transmit_all(&mut self, now: Instant, local: Ipv4Addr, udp_port: u16) -> std::io::Result<()> {
        self.transmit(now, local, udp_port, false).and_then(|()| self.transmit_gsi(now, local, udp_port))
    }

    /// Sends frames from ready QPs; returns false if the wire pushed back. `hold`: only from
    /// QPs whose responses must leave now ([`rc::RcQp::must_respond_now`]); the others stay
    /// ready for the next call.
    #[inline]
    fn transmit(&mut self, now: Instant, local: Ipv4Addr, udp_port: u16, hold: bool) -> std::io::Result<()> {
        // Most calls find nothing ready (every `progress` makes two); the batch is empty
        // between calls, so there is nothing to flush either. Answered here, without the
        // setting up of the loop below.
        if self.ready.is_empty() {
            return Ok(());
        }
        // Holding, and every ready QP has only positive ACKs to send (the engine's poll, with
        // the reply still to come): they all stay ready, in their order, and nothing leaves.
        if hold && !self.ready.iter().any(|q| self.qps.get(q).is_none_or(|e| e.rc.must_respond_now())) {
            return Ok(());
        }
        self.transmit_ready(now, local, udp_port, hold)
    }

    /// [`DevState::transmit`] with a QP ready.
    #[inline(never)]
    fn transmit_ready(
        &mut self,
        now: Instant,
        local: Ipv4Addr,
        udp_port: u16,
        hold: bool,
    ) -> std::io::Result<()> {
        let mut budget = TX_BATCH;
        let mut batch = std::mem::replace(&mut self.batch, TxBatch::placeholder());
        batch.clear();
        let mut result = Ok(());
        let mut held = 0;
        'qps: while budget > 0 && held < self.ready.len() {
            let Some(qpn) = self.ready.pop_front() else { break };
            let mut sent = 0usize;
            {
                let DevState { qps, mrs, wire, stats, ready, .. } = self;
                let Some(e) = qps.get_mut(&qpn) else { continue };
                if hold && !e.rc.must_respond_now() {
                    ready.push_back(qpn);
                    held += 1;
                    continue;
                }
                e.in_ready = false;
                // Whether this QP's frames go straight into a same-host ring (its destination
                // is the same for all of them): then they leave without their ICRC.
                let mut unsealed = None;
                while sent < QP_BURST.min(budget) {
                    let start = batch.used;
                    let Some(slot) = batch.buf.get_mut(start..start + MAX_FRAME) else { break };
                    let Some(tx) = e.rc.poll_transmit(now, mrs, slot, stats) else { break };
                    let unsealed = *unsealed.get_or_insert_with(|| wire.immediate_route(tx.dst));
                    let closed = batch.buf.get_mut(start..start + tx.len).map(|f| match unsealed {
                        true => packet::seal_without_icrc(f),
                        false => packet::seal(&IcrcMeta::new(local, tx.dst, udp_port, udp_port), f),
                    });
                    if closed.is_none_or(|r| r.is_err()) {
                        stats.malformed += 1;
                        continue;
                    }
                    batch.used = start + tx.len;
                    sent += 1;
                    stats.tx_packets += 1;
                    stats.tx_bytes += tx.len as u64;
                    if !batch.fits(tx.dst, tx.len, start, unsealed) {
                        // Send what was batched before this frame, then start over with it.
                        if let Err(err) = batch.flush_before(now, wire, start) {
                            result = Err(err);
                            break 'qps;
                        }
                    }
                    batch.push(tx.dst, tx.len, unsealed);
                }
                // Frames for a same-host ring gain nothing by waiting for other QPs' (there is
                // no system call to share): they leave before this QP's bookkeeping.
                if unsealed == Some(true) {
                    if let Err(err) = batch.flush_all(now, wire) {
                        result = Err(err);
                        break 'qps;
                    }
                }
            }
            budget = budget.saturating_sub(sent.max(1));
            self.after_qp(qpn, Some(now));
        }
        let flushed = batch.flush_all(now, &mut self.wire);
        self.batch = batch;
        match (result, flushed) {
            (Err(e), _) | (Ok(()), Err(e)) if e.kind() != std::io::ErrorKind::WouldBlock => Err(e),
            // A full socket buffer loses the frames; the RC transport retransmits them.
            _ => Ok(()),
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(Reverse((t, qpn))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            let due = {
                let DevState { qps, stats, .. } = self;
                match qps.get_mut(&qpn) {
                    // The QP's live entry: the transport acts on what is due (its deadline may
                    // have moved later since) and `after_qp` arms whatever it waits for next.
                    Some(e) if e.timer == Some(t) => {
                        e.timer = None;
                        e.rc.on_timer(now, stats);
                        true
                    }
                    _ => false,
                }
            };
            if due {
                self.after_qp(qpn, Some(now));
            }
        }
    }
}

impl Device for SoftDevice {
    type Pd = SoftPd;
    type Cq = SoftCq;
    type Qp = SoftQp;
    type Mr = SoftMr;

    fn name(&self) -> &str {
        &self.shared.name
    }

    fn query_device(&self) -> DeviceAttr {
        self.shared.attr.clone()
    }

    fn query_port(&self) -> PortAttr {
        let state = self.shared.lock().port_state;
        PortAttr { state, ..self.shared.port.clone() }
    }

    fn resolve(&self, ip: Ipv4Addr) -> Result<PortAddr, FabricError> {
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(FabricError::InvalidArgument { what: "address is not a unicast IPv4 address" });
        }
        Ok(PortAddr::from_ipv4(ip))
    }

    /// The address the device's wire is bound to (whatever [`SoftConfig::port_addr`] says).
    fn owns_ipv4(&self, ip: Ipv4Addr) -> bool {
        ip == self.shared.ip
    }

    fn alloc_pd(&self) -> Result<SoftPd, FabricError> {
        let mut s = self.shared.lock();
        if s.pds >= self.shared.limits.max_pd {
            return Err(FabricError::Resource { what: "protection domains" });
        }
        s.pds += 1;
        let handle = s.next_pd;
        s.next_pd = s.next_pd.wrapping_add(1).max(1);
        Ok(SoftPd { shared: self.shared.clone(), handle })
    }

    fn create_cq(&self, cqe: u32) -> Result<SoftCq, FabricError> {
        if cqe == 0 {
            return Err(FabricError::InvalidArgument { what: "cqe must be at least 1" });
        }
        let mut s = self.shared.lock();
        s.cqs.retain(|w| w.strong_count() > 0);
        if s.cqs.len() >= self.shared.limits.max_cq as usize {
            return Err(FabricError::Resource { what: "completion queues" });
        }
        let actual = cqe.checked_next_power_of_two().unwrap_or(u32::MAX).min(self.shared.limits.max_cqe);
        let id = s.next_cq;
        s.next_cq = s.next_cq.wrapping_add(1).max(1);
        let shared = Arc::new(CqShared::new(id, actual)?);
        s.cqs.push(Arc::downgrade(&shared));
        Ok(SoftCq { shared })
    }

    unsafe fn reg_mr(
        &self,
        pd: &SoftPd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<SoftMr, FabricError> {
        if len as u64 > self.shared.limits.max_mr_size {
            return Err(FabricError::InvalidArgument { what: "region longer than max_mr_size" });
        }
        if addr.is_null() && len > 0 {
            return Err(FabricError::InvalidArgument { what: "null address" });
        }
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(FabricError::InvalidArgument { what: "REMOTE_WRITE requires LOCAL_WRITE" });
        }
        let base = addr as usize as u64;
        if base.checked_add(len as u64).is_none() {
            return Err(FabricError::InvalidArgument { what: "region wraps the address space" });
        }
        let mut s = self.shared.lock();
        let DevState { mrs, rng, .. } = &mut *s;
        let key = mrs
            .register(pd.handle, base, len as u64, access, rng)
            .ok_or(FabricError::Resource { what: "memory regions" })?;
        Ok(SoftMr { shared: self.shared.clone(), key, addr: base, len, access })
    }

    fn create_qp(
        &self,
        pd: &SoftPd,
        send_cq: &SoftCq,
        recv_cq: &SoftCq,
        attr: &QpInitAttr,
    ) -> Result<SoftQp, FabricError> {
        let l = self.shared.limits;
        let req = attr.cap;
        if req.max_send_wr == 0 && req.max_recv_wr == 0 {
            return Err(FabricError::InvalidArgument { what: "a QP needs a send or a receive queue" });
        }
        let caps = QpCaps {
            max_send_wr: req.max_send_wr.min(l.max_qp_wr),
            max_recv_wr: req.max_recv_wr.min(l.max_qp_wr),
            max_send_sge: req.max_send_sge.clamp(1, l.max_sge),
            max_recv_sge: req.max_recv_sge.clamp(1, l.max_sge),
            max_inline_data: req.max_inline_data.min(l.max_inline_data),
        };
        let wqes = u64::from(caps.max_send_wr) + u64::from(caps.max_recv_wr);
        let mut s = self.shared.lock();
        if s.qps.len() >= l.max_qp as usize {
            return Err(FabricError::Resource { what: "queue pairs" });
        }
        if s.wqe_used + wqes > l.wqe_budget {
            return Err(FabricError::Resource { what: "work queue entries (device memory)" });
        }
        let mut qpn = s.next_qpn;
        while s.qps.contains_key(&qpn) || qpn < 2 {
            qpn = (qpn + 1) & packet::PSN_MASK;
        }
        s.next_qpn = (qpn + 1) & packet::PSN_MASK;
        s.wqe_used += wqes;
        let rc = RcQp::new(qpn, pd.handle, caps, attr.sq_sig_all, self.shared.max_inflight);
        s.qps.insert(
            qpn,
            Box::new(QpEntry {
                rc,
                send_cq: send_cq.shared.clone(),
                recv_cq: recv_cq.shared.clone(),
                wqes,
                in_ready: false,
                timer: None,
            }),
        );
        Ok(SoftQp { shared: self.shared.clone(), qpn, caps })
    }

    fn send_mad(&self, dest: &PortAddr, mad: &Mad) -> Result<(), FabricError> {
        let ip = dest.gid.to_ipv4().ok_or(FabricError::InvalidArgument { what: "GID is not IPv4-mapped" })?;
        self.shared.lock().gsi_tx.push_back((ip, *mad));
        Ok(())
    }

    fn recv_mad(&self) -> Option<(PortAddr, Mad)> {
        if !self.shared.published.mads.load(Ordering::Acquire) {
            return None;
        }
        self.shared.lock().gsi_rx.pop_front()
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        if !self.shared.published.events.load(Ordering::Acquire) {
            return None;
        }
        self.shared.lock().events.pop_front()
    }

    fn progress(&self, now: Instant) -> Result<(), FabricError> {
        self.shared.progress(now, false)
    }

    fn progress_receive(&self, now: Instant) -> Result<(), FabricError> {
        self.shared.progress(now, true)
    }

    fn progress_transmit(&self, now: Instant) -> Result<(), FabricError> {
        let mut s = self.shared.lock();
        s.transmit_all(now, self.shared.ip, self.shared.udp_port).map_err(|e| FabricError::io("send", e))
    }

    fn next_deadline(&self) -> Option<Instant> {
        let s = self.shared.lock();
        if s.work_now() {
            return Some(Instant::ZERO);
        }
        let timer = s.timers.peek().map(|Reverse((t, _))| *t);
        Instant::min_deadline(timer, s.wire.next_deadline())
    }

    fn pollable_fds(&self) -> Vec<RawFd> {
        self.shared.fd.into_iter().collect()
    }

    fn take_signalled_cqs(&self, out: &mut Vec<RawFd>) {
        let p = &self.shared.published;
        if p.signalled_wanted.load(Ordering::Acquire) && !p.signalled.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.shared.lock();
        s.signalled_wanted = true;
        out.append(&mut s.signalled);
    }

    fn fd_readable(&self, fd: RawFd) {
        if self.shared.fd == Some(fd) {
            self.shared.lock().wire.readable();
        }
    }

    fn prepare_to_sleep(&self) -> bool {
        self.shared.lock().wire.prepare_to_sleep()
    }

    fn awake(&self) {
        self.shared.lock().wire.awake();
    }

    fn stats(&self) -> FabricStats {
        let s = self.shared.lock();
        let r = s.wire.ring_stats();
        FabricStats {
            ring_frames_sent: r.sent,
            ring_frames_received: r.received,
            ring_doorbells: r.doorbells,
            ring_full: r.full,
            ring_frames_unsealed_sent: r.unsealed_sent,
            ring_frames_unsealed_received: r.unsealed_received,
            placed_split: s.place.copies_split(),
            placed_overlapped: s.place.copies_run(),
            placed_streamed: s.place.copies_streamed(),
            ..s.stats
        }
    }

    fn work_pending(&self) -> bool {
        let s = self.shared.lock();
        s.work_now() || !s.signalled.is_empty() || s.wire.rx_pending()
    }

    fn packets(&self) -> u64 {
        self.shared.published.packets.load(Ordering::Acquire)
    }

    fn fd_packets(&self) -> Option<u64> {
        self.shared.lock().wire.socket_frames()
    }
}

#[cfg(test)]
mod rc_tests;
#[cfg(test)]
mod tests;
