//! The o2iblnd engine: one LNet network interface on one fabric device, without threads.
//!
//! [`Engine`] binds the protocol pieces — the CM handshake ([`crate::cm::manager::Cm`]), the
//! credit machine ([`crate::credits`]), the wire codec ([`crate::wire`]) — to a fabric
//! [`Device`]. It is deterministic: it never reads a clock, never blocks and never spawns a
//! thread. Its user (the threaded driver, or a simulation) calls:
//! * [`Engine::send`] for each message LNet hands over;
//! * [`Engine::poll`] with the current time whenever a device fd or a CQ fd is readable, after
//!   `send`, and when [`Engine::next_deadline`] passes;
//! * [`Engine::take_fd_changes`] after `poll` to learn which CQ fds to (un)register;
//!
//! and receives upcalls ([`LndUpcalls`]) from inside `poll` and `send`. Upcalls must not call back
//! into the engine (the driver queues their `Lnd::send` calls); a driver that keeps the sends
//! its upcalls make in a queue of its own hands them over right after the receive that made
//! them through [`Engine::set_early_sends`], and they are posted then.
//!
//! Guarantees: every send `send` accepted is reported exactly once through `send_done`, every
//! accepted receive exactly once through `recv_done` — on success, on timeout (the whole
//! connection is closed, o2iblnd-style), on close, on peer failure and on shutdown.
//!
//! # Layout
//! This file holds the engine's state, its construction and the poll loop; each part of the
//! protocol is an `impl Engine` block of its own:
//! * `send`: LNet's sends, the message type, descriptors, RDMA WRITE plans;
//! * `connect`: connecting and accepting on the CM, rejections and retries;
//! * `post`: what the credit machine lets go, packed and posted (NOOPs included);
//! * `cq` and `completion`: reaping the CQs, matching each completion to its buffer or
//!   transmit, and ending a transmit exactly once;
//! * `rx`: received messages, by type, and reposting their buffers;
//! * `timers`: transmit deadlines, keepalives, connect deadlines, descriptor waits;
//! * `link`: the port going down and up, and the device failing;
//! * `close`: closing and destroying connections, shutdown;
//! * `conn`, `peer`, `tx`, `dirty`: the connection, peer and transmit records.

mod close;
mod completion;
mod conn;
mod connect;
mod cq;
mod dirty;
pub mod link;
mod peer;
mod post;
mod rx;
mod send;
mod sink;
pub use send::validate_send;
#[cfg(test)]
mod tests;
mod timers;
pub(crate) mod tx;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lnet_shim::event::Errno;
use lnet_shim::hash::FastMap;
use lnet_shim::lnd::{Health, LndError, LndSend, LndUpcalls, PeerInfo};
use lnet_shim::nid::Nid;
use slab::Slab;

use self::conn::Conn;
pub use self::link::LinkState;
use self::peer::Peer;
use self::tx::{SlotPool, Tx};
use crate::cm::ip_cm::{PortSpace, ip_service_id};
use crate::cm::manager::{Cm, CmConfig, ConnId};
use crate::fabric::dma::RegisteredBuf;
use crate::fabric::{Access, Device, FabricError, QueuePair, Wc};
use crate::rng::Rng;
use crate::time::Instant;
use crate::tunables::Tunables;
use crate::wire::IBLND_MSG_SIZE;

/// How an engine is set up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// This interface's NID (its address must be the device port's).
    pub nid: Nid,
    /// The `ko2iblnd` tunables (already finalized).
    pub tunables: Tunables,
    /// This interface's incarnation stamp (o2iblnd: wall-clock µs at startup).
    pub incarnation: u64,
    /// Seed for PSNs, comm ids and cookies.
    pub seed: u64,
    /// CM response timeout code (4.096 µs × 2^code; Linux uses 20 on RoCE).
    pub cm_response_timeout: u8,
    /// Local ACK timeout code of the QPs (retransmission timer).
    pub qp_ack_timeout: u8,
    /// RNR NAK timer code offered to peers.
    pub min_rnr_timer: u8,
    /// RDMA fragments this side accepts per transfer (o2iblnd: 257, `IBLND_MAX_RDMA_FRAGS`);
    /// connection requests asking for more are rejected with RDMA_FRAGS.
    pub max_frags: u16,
    /// This engine's share of the CM's comm ID space when several share a device port
    /// ([`crate::cm::CmConfig::id_partition`]; the driver's scheduler shards). `(0, 1)`: alone.
    pub cm_id_partition: (u32, u32),
}

impl EngineConfig {
    /// Defaults for the software fabric: the CM and QP timers of a low-latency local network
    /// (CM response 4.096 µs × 2^16 ≈ 0.27 s; ACK timeout 2^14 ≈ 67 ms).
    pub fn new(nid: Nid, tunables: Tunables, incarnation: u64, seed: u64) -> EngineConfig {
        EngineConfig {
            nid,
            tunables,
            incarnation,
            seed,
            cm_response_timeout: 16,
            qp_ack_timeout: 14,
            min_rnr_timer: 4,
            max_frags: crate::wire::IBLND_MAX_RDMA_FRAGS as u16,
            cm_id_partition: (0, 1),
        }
    }
}

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The device failed a setup call.
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    /// The NID's address is not the device port's ([`crate::fabric::Device::owns_ipv4`]).
    #[error("NID {nid} is not an address of the device port (port address {port:?})")]
    WrongAddress {
        /// The NID.
        nid: Nid,
        /// The port address.
        port: crate::fabric::PortAddr,
    },
    /// The NID is not on an `o2ib` network: o2iblnd drives only those (LND type 5).
    #[error("NID {nid} is not on an o2ib network (o2iblnd drives o2ib networks only, e.g. {}@o2ib)", nid.addr())]
    NotO2ib {
        /// The NID.
        nid: Nid,
    },
}

/// Counters of one engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Messages posted (all types).
    pub tx_msgs: u64,
    /// Message bytes posted (headers included).
    pub tx_bytes: u64,
    /// Messages received.
    pub rx_msgs: u64,
    /// Message bytes received.
    pub rx_bytes: u64,
    /// Payload bytes moved by RDMA WRITE.
    pub rdma_bytes: u64,
    /// NOOPs posted.
    pub noops: u64,
    /// Times a connection's credited sends ran out of credits (once per wait for the
    /// peer's credits, [`crate::credits::CreditCounters::stalls`]).
    pub credit_stalls: u64,
    /// Connections established.
    pub conns_established: u64,
    /// Connections closed.
    pub conns_closed: u64,
    /// Connection attempts (our REQs) rejected by the peer.
    pub connects_rejected: u64,
    /// Accepted connection requests whose REP the peer then rejected (`-ECONNRESET`).
    pub accepts_reset: u64,
    /// Sinks registered for one transfer (`fmr_cache=0`; each deregistered when it ends).
    pub sink_registrations: u64,
    /// Connection requests this side rejected (any reason, allow-list refusals included).
    pub accepts_rejected: u64,
    /// Connection requests rejected because the peer's NID is not in `accept_nids` (also
    /// counted in `accepts_rejected`).
    pub accepts_refused_nid: u64,
    /// Connections closed for a protocol error by the peer.
    pub protocol_errors: u64,
    /// Connections closed because a message named the wrong NIDs or incarnation stamps.
    pub stale_msgs: u64,
    /// Transmits that timed out.
    pub tx_timeouts: u64,
    /// Sends that waited for a free descriptor.
    pub tx_pool_waits: u64,
    /// Completions ignored as stale.
    pub stale_completions: u64,
    /// Sends completed with an error.
    pub send_errors: u64,
    /// Times the port went down (`PORT_ERR` while it was active; [`link`]).
    pub port_errors: u64,
    /// Times the port came back (`PORT_ACTIVE` while it was down).
    pub port_recoveries: u64,
    /// Times the device failed (`DEVICE_FATAL`; at most once).
    pub device_fatal: u64,
    /// Sends refused because the port was down or the device had failed.
    pub sends_refused_link: u64,
}

impl EngineStats {
    /// Adds another engine's counters (the driver's schedulers, summed).
    pub fn merge(&mut self, o: &EngineStats) {
        self.tx_msgs += o.tx_msgs;
        self.tx_bytes += o.tx_bytes;
        self.rx_msgs += o.rx_msgs;
        self.rx_bytes += o.rx_bytes;
        self.rdma_bytes += o.rdma_bytes;
        self.noops += o.noops;
        self.credit_stalls += o.credit_stalls;
        self.conns_established += o.conns_established;
        self.conns_closed += o.conns_closed;
        self.connects_rejected += o.connects_rejected;
        self.accepts_reset += o.accepts_reset;
        self.sink_registrations += o.sink_registrations;
        self.accepts_rejected += o.accepts_rejected;
        self.accepts_refused_nid += o.accepts_refused_nid;
        self.protocol_errors += o.protocol_errors;
        self.stale_msgs += o.stale_msgs;
        self.tx_timeouts += o.tx_timeouts;
        self.tx_pool_waits += o.tx_pool_waits;
        self.stale_completions += o.stale_completions;
        self.send_errors += o.send_errors;
        self.port_errors += o.port_errors;
        self.port_recoveries += o.port_recoveries;
        self.device_fatal += o.device_fatal;
        self.sends_refused_link += o.sends_refused_link;
    }
}

/// One established connection, as [`Engine::conn_details`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnDetail {
    /// This side's QP number.
    pub local_qpn: u32,
    /// The peer's QP number.
    pub remote_qpn: u32,
    /// Credit counters.
    pub credits: crate::credits::CreditCounters,
    /// Transmits posted and not finished.
    pub active_txs: usize,
}

/// Registration-cache owner ids: one per engine.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// A send waiting for a descriptor, or a reply that could not get one.
enum Waiting {
    Send(LndSend),
    /// A received message whose answer needs a descriptor: (connection key, generation, rx).
    Rx(usize, u32, u32, u32),
}

/// A CQ fd to add to or remove from the driver's poller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdChange {
    /// Watch `fd`; report readiness with [`Engine::cq_ready`]`(token)`.
    Add {
        /// The fd.
        fd: std::os::fd::RawFd,
        /// The token to report.
        token: usize,
    },
    /// Stop watching `fd`.
    Remove {
        /// The fd.
        fd: std::os::fd::RawFd,
    },
}

/// What [`Engine::poll_completions`] hands to [`Engine::poll_finish`]: the turn's starting
/// activity count, so the finished turn can say whether anything happened.
#[derive(Debug)]
#[must_use = "a turn is finished with Engine::poll_finish"]
pub struct PollTurn {
    before: u64,
}

/// One o2iblnd network interface on one device.
pub struct Engine<D: Device> {
    dev: D,
    pd: D::Pd,
    cfg: EngineConfig,
    owner: u64,
    upcalls: Arc<dyn LndUpcalls>,
    cm: Cm,
    service_id: u64,
    rng: Rng,
    peers: BTreeMap<Nid, Peer>,
    conns: Slab<Conn<D>>,
    next_gen: u32,
    by_cm: FastMap<u32, usize>,
    by_qpn: FastMap<u32, usize>,
    /// Connections by their CQ's event fd ([`Device::take_signalled_cqs`]).
    by_cq_fd: FastMap<std::os::fd::RawFd, usize>,
    signalled: Vec<std::os::fd::RawFd>,
    txs: Slab<Tx>,
    slots: SlotPool,
    msgs: RegisteredBuf<D>,
    cookies: FastMap<u64, usize>,
    next_cookie: u64,
    /// No live transmit's deadline is earlier (`None`: none is). Arming a deadline lowers it;
    /// nothing raises it but [`Engine::expire`], which looks at every transmit once it passes
    /// (about once per `timeout` while traffic flows: transmits finish long before theirs).
    tx_check: Option<Instant>,
    /// No reconnect after a reject is due earlier (`None`: none is); [`Engine::reconnect_due`]
    /// recomputes it.
    reconnect_check: Option<Instant>,
    waiting: VecDeque<Waiting>,
    cq_ready: VecDeque<usize>,
    poll_all_cqs: bool,
    /// Connections whose CQ is unarmed and drained on every poll (see [`cq`]).
    polled: Vec<usize>,
    /// How long a CQ stays polled after its last completion ([`Engine::set_cq_poll_window`]).
    cq_poll_window: Duration,
    /// The CQs one `reap_completions` drains (kept to reuse its allocation).
    reap_keys: Vec<usize>,
    fd_changes: Vec<FdChange>,
    dirty: dirty::Dirty,
    /// Connections whose NOOP found no free descriptor: retried when any descriptor comes
    /// back (o2iblnd's connd re-checks `kiblnd_need_noop` on every connection for this).
    noop_starved: Vec<usize>,
    next_scan: Instant,
    stats: EngineStats,
    shutdown: bool,
    /// The port's link ([`link`]).
    link: LinkState,
    wcs: Vec<Wc>,
    /// Successful send completions reaped in the first half of a poll, handled after its
    /// second half has transmitted ([`Engine::poll_finish`]): what they do (LNet's send
    /// events, freeing descriptors) is bookkeeping, while a receive reaped with them may have
    /// queued a reply that a peer is waiting for.
    deferred_tx: Vec<Wc>,
    /// Set while [`Engine::poll_completions`] reaps: successful send completions wait.
    defer_tx: bool,
    /// Where the sends an upcall made on this thread wait (the driver's hook,
    /// [`Engine::set_early_sends`]): taken right after the receive that made them.
    early_sends: Option<fn(&mut Vec<LndSend>)>,
    early_buf: Vec<LndSend>,
    /// Inside [`Engine::drain_cq`]: completions are being handled in order already.
    reaping: bool,
    scratch: Vec<u8>,
    /// Completions and CM events handled (part of [`Engine::poll`]'s activity measure).
    work: u64,
}

/// How often connections are scanned for keepalives, connect deadlines and zombies.
const SCAN_INTERVAL: Duration = Duration::from_millis(250);
/// How long a closing connection may wait for its flushed work requests.
const ZOMBIE_GRACE: Duration = Duration::from_secs(10);
/// Work completions reaped per CQ poll.
const WC_BATCH: usize = 64;

fn err(errno: Errno, health: Health) -> LndError {
    LndError::new(errno, health)
}

impl<D: Device> Engine<D> {
    /// Starts an interface on `dev`: allocates the PD and the transmit pool (`ntx` message
    /// buffers) and listens on the `service` port.
    pub fn new(dev: D, cfg: EngineConfig, upcalls: Arc<dyn LndUpcalls>) -> Result<Engine<D>, EngineError> {
        if cfg.nid.net().net_type() != Some(lnet_shim::nid::NetType::O2ib) {
            return Err(EngineError::NotO2ib { nid: cfg.nid });
        }
        // The CM names every port by its IPv4 address, this one too: on RoCE that is the port's
        // GID, on InfiniBand it is not (the port's GID is its GUID's), so the check asks the
        // device whether the NID's address is its own rather than comparing GIDs.
        let port = dev.query_port();
        let mine = dev.resolve(cfg.nid.addr())?;
        if !dev.owns_ipv4(cfg.nid.addr()) {
            return Err(EngineError::WrongAddress { nid: cfg.nid, port: port.addr });
        }
        let pd = dev.alloc_pd()?;
        let ntx = cfg.tunables.ntx.max(16);
        let msgs = RegisteredBuf::new(&dev, &pd, ntx as usize * IBLND_MSG_SIZE, Access::LOCAL_WRITE)?;
        let mut rng = Rng::new(cfg.seed);
        let mut cm_cfg = CmConfig::roce(mine, cfg.nid.addr(), dev.query_device().node_guid);
        cm_cfg.cm_response_timeout = cfg.cm_response_timeout;
        cm_cfg.packet_life_time = cfg.cm_response_timeout.saturating_sub(2);
        cm_cfg.timewait = crate::cm::mad::linux_cm_timeout(cfg.qp_ack_timeout);
        cm_cfg.id_partition = cfg.cm_id_partition;
        let mut cm = Cm::new(cm_cfg, rng.next_u64());
        let service_id = ip_service_id(PortSpace::Tcp, cfg.tunables.service);
        cm.listen(service_id);
        let next_cookie = rng.next_u64() | 1;
        Ok(Engine {
            dev,
            pd,
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            upcalls,
            cm,
            service_id,
            rng,
            peers: BTreeMap::new(),
            conns: Slab::new(),
            next_gen: 1,
            by_cm: FastMap::default(),
            by_qpn: FastMap::default(),
            by_cq_fd: FastMap::default(),
            signalled: Vec::new(),
            txs: Slab::new(),
            slots: SlotPool::new(ntx),
            msgs,
            cookies: FastMap::default(),
            next_cookie,
            tx_check: None,
            reconnect_check: None,
            waiting: VecDeque::new(),
            cq_ready: VecDeque::new(),
            poll_all_cqs: false,
            polled: Vec::new(),
            cq_poll_window: Duration::ZERO,
            reap_keys: Vec::new(),
            fd_changes: Vec::new(),
            dirty: dirty::Dirty::default(),
            noop_starved: Vec::new(),
            next_scan: Instant::ZERO,
            stats: EngineStats::default(),
            shutdown: false,
            link: LinkState::at_start(port.state),
            wcs: vec![Wc::default(); WC_BATCH],
            deferred_tx: Vec::new(),
            defer_tx: false,
            early_sends: None,
            early_buf: Vec::new(),
            reaping: false,
            scratch: vec![0u8; IBLND_MSG_SIZE],
            work: 0,
            cfg,
        })
    }

    /// This interface's NID.
    pub fn nid(&self) -> Nid {
        self.cfg.nid
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        let mut s = self.stats;
        s.credit_stalls += self.conns.iter().map(|(_, c)| c.credits.counters().stalls).sum::<u64>();
        s
    }

    /// The CM's counters.
    pub fn cm_stats(&self) -> crate::cm::manager::CmStats {
        self.cm.stats()
    }

    /// Poll every connection's CQ on each [`Engine::poll`] instead of waiting for
    /// [`Engine::cq_ready`] (simulations, which have no fds).
    pub fn set_poll_all_cqs(&mut self, on: bool) {
        self.poll_all_cqs = on;
    }

    /// The driver saw the CQ fd registered with `token` become readable.
    pub fn cq_ready(&mut self, token: usize) {
        self.cq_ready.push_back(token);
    }

    /// CQ fds to (un)register since the last call.
    pub fn take_fd_changes(&mut self) -> Vec<FdChange> {
        std::mem::take(&mut self.fd_changes)
    }

    /// Descriptors in use and total (for leak checks).
    pub fn tx_descriptors(&self) -> (usize, u32) {
        (self.txs.len(), self.slots.total())
    }

    /// Live connections (any state).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Whether [`Engine::shutdown`] finished: nothing left in flight.
    pub fn is_idle(&self) -> bool {
        self.conns.is_empty() && self.txs.is_empty() && self.waiting.is_empty()
    }

    fn alloc_cookie(&mut self) -> u64 {
        self.next_cookie = self.next_cookie.wrapping_add(2);
        self.next_cookie
    }

    fn alloc_gen(&mut self) -> u32 {
        self.next_gen = (self.next_gen + 1) & 0x3fff_ffff;
        self.next_gen.max(1)
    }

    fn tx_timeout(&self) -> Duration {
        self.cfg.tunables.tx_timeout()
    }

    /// Re-arms a transmit's deadline to `now + timeout` (o2iblnd sets it whenever a transmit
    /// is queued on a connection).
    fn set_deadline(&mut self, now: Instant, txk: usize) {
        let timeout = self.tx_timeout();
        if let Some(t) = self.txs.get_mut(txk) {
            t.deadline = now + timeout;
            self.tx_check = Instant::min_deadline(self.tx_check, Some(t.deadline));
        }
    }

    // ------------------------------------------------------------------ the poll loop

    /// Does all work due at `now`: device progress, CM, completions, timers, posting. Returns
    /// whether anything happened (frames moved, messages or completions handled), which a
    /// driver uses to decide whether to keep polling or to sleep.
    ///
    /// It is [`Engine::poll_completions`] followed by [`Engine::poll_finish`]; a driver that
    /// takes LNet's sends between the two halves lets a send an upcall queued (a reply made in
    /// an event callback) go out in the same turn.
    pub fn poll(&mut self, now: Instant) -> bool {
        let turn = self.poll_completions(now);
        self.poll_finish(now, turn)
    }

    /// The first half of a poll: device progress (frames received, [`Device::progress_receive`]),
    /// CM, async events and the completions reaped, so every receive upcall of the turn has
    /// run; successful send completions wait for [`Engine::poll_finish`], which must follow.
    /// Sends taken before it are posted and transmitted in this turn.
    pub fn poll_completions(&mut self, now: Instant) -> PollTurn {
        let before = self.activity();
        if let Err(e) = self.dev.progress_receive(now) {
            // A device error is not a protocol event; the fabric retries on the next call.
            let _ = e;
        }
        self.take_signalled();
        while let Some((from, mad)) = self.dev.recv_mad() {
            self.work += 1;
            self.cm.handle_mad(now, from, &mad);
        }
        while let Some(ev) = self.dev.poll_async_event() {
            self.handle_async(now, ev);
        }
        self.cm.handle_timeout(now);
        while let Some(ev) = self.cm.poll_event() {
            self.handle_cm_event(now, ev);
        }
        self.defer_tx = true;
        self.reap_completions(now);
        self.defer_tx = false;
        PollTurn { before }
    }

    /// The second half of a poll: timeouts, waiting transmits, queued sends posted, CM MADs
    /// sent, and device progress (frames transmitted). Returns whether anything happened in
    /// the whole turn.
    pub fn poll_finish(&mut self, now: Instant, turn: PollTurn) -> bool {
        self.expire(now);
        if self.reconnect_check.is_some_and(|t| t <= now) {
            self.reconnect_due(now);
        }
        if now >= self.next_scan {
            self.next_scan = now + SCAN_INTERVAL;
            self.scan(now);
        }
        self.retry_waiting(now);
        while let Some(key) = self.dirty.pop_first() {
            self.check_sends(now, key);
        }
        while let Some((to, mad)) = self.cm.poll_transmit() {
            let _ = self.dev.send_mad(&to, &mad);
        }
        if !self.deferred_tx.is_empty() {
            // The replies leave before the deferred bookkeeping, which must not wait for the
            // receive in `progress` (a large same-host copy holds up a send's completion, and
            // with it LNet's bulk event and the reply after it).
            let _ = self.dev.progress_transmit(now);
            self.handle_deferred_tx(now);
        }
        let _ = self.dev.progress(now);
        self.take_signalled();
        self.activity() != turn.before
    }

    /// Installs the driver's hook for sends an upcall queued on this thread (a reply an event
    /// callback sent): it moves them into its argument, in their order, and leaves anything
    /// else queued. The engine takes them right after the receive whose upcall made them and
    /// launches them at once, so a reply leaves before the rest of the turn's completions and
    /// bookkeeping.
    pub fn set_early_sends(&mut self, hook: fn(&mut Vec<LndSend>)) {
        self.early_sends = Some(hook);
    }

    /// Takes the sends the upcalls of a receive made ([`Engine::set_early_sends`]) and
    /// launches them; the connections they went to post what their credits allow.
    pub(super) fn take_early_sends(&mut self, now: Instant) {
        let Some(hook) = self.early_sends else { return };
        let mut sends = std::mem::take(&mut self.early_buf);
        hook(&mut sends);
        if sends.is_empty() {
            self.early_buf = sends;
            return;
        }
        for msg in sends.drain(..) {
            let token = msg.token;
            if let Err(e) = self.send(now, msg) {
                self.upcalls.send_done(token, Err(e));
            }
        }
        self.early_buf = sends;
        while let Some(key) = self.dirty.pop_first() {
            self.check_sends(now, key);
        }
    }

    /// Handles the send completions [`Engine::poll_completions`] set aside, in their order.
    /// Also called before any other completion is handled and before a connection closes,
    /// so a send queue's completions are always seen in order and a send the peer received
    /// completes as sent.
    pub(super) fn handle_deferred_tx(&mut self, now: Instant) {
        if self.deferred_tx.is_empty() {
            return;
        }
        let mut wcs = std::mem::take(&mut self.deferred_tx);
        for wc in wcs.drain(..) {
            self.handle_wc(now, wc);
        }
        self.deferred_tx = wcs;
    }

    /// A counter that moves whenever the engine or its device does something.
    fn activity(&self) -> u64 {
        self.work
            .wrapping_add(self.stats.tx_msgs)
            .wrapping_add(self.stats.rx_msgs)
            .wrapping_add(self.dev.packets())
    }

    /// When [`Engine::poll`] must run next even if no fd fires (`Some(t <= now)`: now).
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.dirty.is_empty() || !self.cq_ready.is_empty() {
            return Some(Instant::ZERO);
        }
        let mut t = Instant::min_deadline(self.dev.next_deadline(), self.cm.poll_timeout());
        t = Instant::min_deadline(t, self.tx_check);
        t = Instant::min_deadline(t, self.reconnect_check);
        if !self.conns.is_empty() || !self.waiting.is_empty() {
            t = Instant::min_deadline(t, Some(self.next_scan));
        }
        t
    }

    // ------------------------------------------------------------------ LNet-facing API

    /// Peers and their connections.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.peers
            .values()
            .map(|p| {
                let est: Vec<&Conn<D>> = conn::established(&self.conns, &p.conns).map(|(_, c)| c).collect();
                let counters: Vec<_> = est.iter().map(|c| c.credits.counters()).collect();
                PeerInfo {
                    nid: p.nid,
                    state: p.state(est.len()),
                    conns: est.len(),
                    queue_depth: counters.first().map_or(0, |c| c.queue_depth as u16),
                    credits: counters.iter().map(|c| c.credits).sum(),
                    outstanding_credits: counters.iter().map(|c| c.outstanding).sum(),
                    min_credits: counters.iter().map(|c| c.min_credits).min().unwrap_or(0),
                    queued: p.pending.len() + counters.iter().map(|c| c.queued).sum::<usize>(),
                    active: est.iter().map(|c| c.active_txs.len()).sum(),
                }
            })
            .collect()
    }

    /// The established connections to `peer` with their QP numbers and credit counters.
    pub fn conn_details(&self, peer: Nid) -> Vec<ConnDetail> {
        self.peers
            .get(&peer)
            .map(|p| {
                conn::established(&self.conns, &p.conns)
                    .map(|(_, c)| ConnDetail {
                        local_qpn: c.qp.qp_num(),
                        remote_qpn: c.remote_qpn,
                        credits: c.credits.counters(),
                        active_txs: c.active_txs.len(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Each peer's attempt counters against its connections still being set up (tests: the
    /// simulations check it after every poll). `connecting` and `accepting` decide whether a
    /// peer is reachable and whether a new attempt may start, so a count that drifts from the
    /// connections fails or holds transmits wrongly.
    #[cfg(test)]
    pub(crate) fn check_attempt_counts(&self) -> Result<(), String> {
        for (nid, p) in &self.peers {
            let of = |state| self.conns.iter().filter(|(_, c)| c.peer == *nid && c.state == state).count();
            let (active, passive) = (of(conn::ConnState::ActiveConnect), of(conn::ConnState::PassiveWait));
            if (p.connecting as usize, p.accepting as usize) != (active, passive) {
                return Err(format!(
                    "{nid}: connecting {} accepting {}, but {active} active and {passive} passive connections being set up",
                    p.connecting, p.accepting
                ));
            }
        }
        Ok(())
    }

    /// The CM id table size (leak checks).
    pub fn cm_live(&self) -> usize {
        self.cm.live()
    }

    fn conn_for_cm(&self, id: ConnId) -> Option<usize> {
        self.by_cm.get(&id.0).copied()
    }
}
