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

mod conn;
mod connect;
mod cq;
mod dirty;
mod peer;
mod rx;
mod send;
pub use send::validate_send;
#[cfg(test)]
mod tests;
pub(crate) mod tx;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lnet_shim::event::Errno;
use lnet_shim::hash::FastMap;
use lnet_shim::lnd::{Health, LndError, LndSend, LndUpcalls, PeerInfo, SendStatus};
use lnet_shim::nid::Nid;
use slab::Slab;

use self::conn::{Conn, ConnState};
use self::peer::Peer;
use self::tx::{SlotPool, Tx, Upper, WrKind, parse_wr_id, split_rx_index};
use crate::cm::ip_cm::{PortSpace, ip_service_id};
use crate::cm::manager::{Cm, CmConfig, ConnId};
use crate::fabric::dma::RegisteredBuf;
use crate::fabric::{
    Access, AsyncEvent, CompletionQueue, Device, FabricError, QpModify, QueuePair, Wc, WcStatus,
};
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
    /// Connection attempts rejected by the peer.
    pub connects_rejected: u64,
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
        self.accepts_rejected += o.accepts_rejected;
        self.accepts_refused_nid += o.accepts_refused_nid;
        self.protocol_errors += o.protocol_errors;
        self.stale_msgs += o.stale_msgs;
        self.tx_timeouts += o.tx_timeouts;
        self.tx_pool_waits += o.tx_pool_waits;
        self.stale_completions += o.stale_completions;
        self.send_errors += o.send_errors;
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
        if !self.conns.is_empty() || !self.waiting.is_empty() {
            t = Instant::min_deadline(t, Some(self.next_scan));
        }
        t
    }

    fn handle_async(&mut self, now: Instant, ev: AsyncEvent) {
        match ev {
            AsyncEvent::CommEst { qp_num } => {
                if let Some(&key) = self.by_qpn.get(&qp_num) {
                    if let Some(id) = self.conns.get(key).and_then(|c| c.cm_id) {
                        self.cm.notify_comm_est(now, id);
                    }
                }
            }
            AsyncEvent::QpFatal { qp_num } => {
                if let Some(&key) = self.by_qpn.get(&qp_num) {
                    self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
                }
            }
            AsyncEvent::CqErr { cq_id } => {
                let keys: Vec<usize> =
                    self.conns.iter().filter(|(_, c)| c.cq.id() == cq_id).map(|(k, _)| k).collect();
                for key in keys {
                    self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
                }
            }
            AsyncEvent::PortErr | AsyncEvent::PortActive => {}
        }
    }

    fn handle_wc(&mut self, now: Instant, wc: Wc) {
        self.work += 1;
        let Some((kind, generation, index)) = parse_wr_id(wc.wr_id) else {
            self.stats.stale_completions += 1;
            return;
        };
        match kind {
            WrKind::Rx => self.rx_completion(now, generation, index, wc),
            WrKind::Tx => self.tx_completion(now, generation, index as usize, wc),
            WrKind::Rdma => {
                // Unsignaled: only failures arrive, and the SEND behind the WRITE fails too.
                if wc.status != WcStatus::WrFlushErr && wc.status != WcStatus::Success {
                    if let Some(c) = self
                        .txs
                        .get(index as usize)
                        .filter(|t| t.generation == generation)
                        .and_then(|t| t.conn)
                    {
                        self.close_conn(now, c, err(Errno::EIO, Health::RemoteDropped));
                    }
                }
            }
        }
    }

    fn rx_completion(&mut self, now: Instant, generation: u32, index: u32, wc: Wc) {
        let (key, rx) = split_rx_index(index);
        let Some(conn) = self.conns.get_mut(key).filter(|c| c.generation == generation) else {
            self.stats.stale_completions += 1;
            return;
        };
        conn.posted_rx = conn.posted_rx.saturating_sub(1);
        if wc.status != WcStatus::Success {
            if conn.state != ConnState::Closing {
                self.close_conn(now, key, err(Errno::EIO, Health::RemoteDropped));
            }
            return;
        }
        match conn.state {
            ConnState::Established => self.handle_rx(now, key, rx, wc.byte_len),
            ConnState::ActiveConnect => conn.early_rx.push((rx, wc.byte_len)),
            ConnState::PassiveWait => {
                // Only the peer that got our REP knows this QP's number and PSN: its message
                // stands for the RTU, as COMM_EST does (`rdma_notify`). Without that, a lost
                // RTU (every retry of it) would fail the accept while the peer, established,
                // had its sends acknowledged, and these receives would be lost.
                conn.early_rx.push((rx, wc.byte_len));
                if let Some(id) = conn.cm_id {
                    self.cm.notify_comm_est(now, id);
                }
            }
            ConnState::Closing => {}
        }
    }

    fn tx_completion(&mut self, now: Instant, generation: u32, key: usize, wc: Wc) {
        let Some(tx) = self.txs.get_mut(key).filter(|t| t.generation == generation) else {
            self.stats.stale_completions += 1;
            return;
        };
        tx.sending = tx.sending.saturating_sub(1);
        let noop = tx.noop;
        let conn_key = tx.conn;
        let failed = wc.status != WcStatus::Success;
        if failed {
            tx.fail(err(Errno::EIO, Health::RemoteDropped));
        }
        if let Some(c) = conn_key.and_then(|k| self.conns.get_mut(k)) {
            c.sending = c.sending.saturating_sub(1);
            c.credits.send_completed(noop);
        }
        if let Some(c) = conn_key {
            if failed {
                self.close_conn(now, c, err(Errno::EIO, Health::RemoteDropped));
            } else {
                self.dirty.insert(c);
            }
        }
        self.tx_maybe_done(key);
        // Outside a drain (a deferred completion, `handle_deferred_tx`), nothing else looks
        // at whether a closing connection has now gone quiet.
        if let Some(c) = conn_key.filter(|_| !self.reaping) {
            self.maybe_destroy(now, c);
        }
    }

    // ------------------------------------------------------------------ transmit lifecycle

    /// Finishes a transmit if nothing holds it any more: reports upward, frees its slot.
    fn tx_maybe_done(&mut self, key: usize) {
        let finished = self.txs.get(key).is_some_and(Tx::is_finished);
        if !finished {
            return;
        }
        let tx = self.txs.remove(key);
        if self.txs.is_empty() {
            // Nothing left to expire: no wake-up for deadlines of transmits already gone.
            self.tx_check = None;
        }
        self.slots.give(tx.slot);
        if tx.cookie != 0 && self.cookies.get(&tx.cookie) == Some(&key) {
            self.cookies.remove(&tx.cookie);
        }
        if let Some(c) = tx.conn.and_then(|k| self.conns.get_mut(k)) {
            c.active_txs.retain(|&t| t != key);
        }
        // A descriptor is free: every connection that could not get one for its NOOP tries
        // again, whichever connection this transmit was on (else a receive-only connection
        // would keep its peer's credits until the keepalive, after the peer's sends expired).
        for k in std::mem::take(&mut self.noop_starved) {
            if let Some(c) = self.conns.get_mut(k) {
                c.noop_starved = false;
                self.dirty.insert(k);
            }
        }
        match tx.upper {
            Upper::None => {}
            Upper::Send(token) => {
                if tx.status.is_err() {
                    self.stats.send_errors += 1;
                }
                self.upcalls.send_done(token, tx.status.map(|_| SendStatus { reply_len: tx.reply_len }));
            }
            Upper::Recv(token) => self.upcalls.recv_done(token, tx.status),
        }
    }

    /// Ends a transmit with `error`: it leaves every queue and stops waiting for the peer; it
    /// is reported now unless a posted send must still come back (its flush reports it).
    fn abort_tx(&mut self, txk: usize, error: LndError) {
        if let Some(tx) = self.txs.get_mut(txk) {
            tx.queued = false;
            tx.waiting = false;
            tx.fail(error);
        }
        self.tx_maybe_done(txk);
    }

    /// Checks deadlines of transmits (queued, active, or waiting for a connection), once the
    /// earliest may have passed: every transmit is looked at, those due expire in deadline
    /// order, and the earliest deadline left is the next check.
    fn expire(&mut self, now: Instant) {
        if self.tx_check.is_none_or(|t| t > now) {
            return;
        }
        let mut due = Vec::new();
        let mut next = None;
        for (key, tx) in self.txs.iter() {
            if tx.deadline <= now {
                due.push((tx.deadline, key, tx.generation));
            } else {
                next = Instant::min_deadline(next, Some(tx.deadline));
            }
        }
        self.tx_check = next;
        due.sort_unstable();
        for (t, key, generation) in due {
            // Still the same transmit with the same deadline (an earlier expiry may have
            // ended it, or moved it to another connection with a new deadline).
            let Some(tx) = self.txs.get_mut(key).filter(|tx| tx.generation == generation && tx.deadline == t)
            else {
                continue;
            };
            // Expired once: it does not expire again unless a new deadline is armed.
            tx.deadline = Instant::FAR_FUTURE;
            let tx = &*tx;
            self.stats.tx_timeouts += 1;
            match tx.conn {
                // o2iblnd: any expired transmit closes the whole connection.
                Some(c) => {
                    let health = if tx.sending > 0 || tx.waiting {
                        Health::RemoteTimeout
                    } else {
                        Health::LocalTimeout
                    };
                    self.close_conn(now, c, err(Errno::ETIMEDOUT, health));
                }
                None => {
                    let peer = tx.peer;
                    if let Some(p) = self.peers.get_mut(&peer) {
                        p.pending.retain(|&k| k != key);
                    }
                    self.abort_tx(key, err(Errno::ETIMEDOUT, Health::NetworkTimeout));
                }
            }
        }
    }

    /// Periodic work: keepalives, connect deadlines, zombie connections.
    fn scan(&mut self, now: Instant) {
        let keepalive = self.cfg.tunables.keepalive_interval();
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            let Some(c) = self.conns.get(key) else { continue };
            match c.state {
                ConnState::Established => {
                    if keepalive.is_some_and(|ka| now >= c.last_send + ka) {
                        self.dirty.insert(key);
                    }
                }
                ConnState::ActiveConnect | ConnState::PassiveWait => {
                    if now >= c.connect_deadline {
                        self.connect_failed(now, key, err(Errno::ETIMEDOUT, Health::NetworkTimeout));
                    }
                }
                ConnState::Closing => {
                    if now >= c.zombie_deadline {
                        self.destroy_conn(now, key);
                    } else {
                        self.maybe_destroy(now, key);
                    }
                }
            }
        }
        // Peers whose paced reconnect is due.
        let due: Vec<Nid> = self
            .peers
            .iter()
            .filter(|(_, p)| {
                !p.pending.is_empty() && p.connecting == 0 && p.accepting == 0 && now >= p.next_attempt
            })
            .filter(|(_, p)| {
                !p.conns.iter().any(|&k| self.conns.get(k).is_some_and(|c| c.state != ConnState::Closing))
            })
            .map(|(n, _)| *n)
            .collect();
        for nid in due {
            self.connect_peer(now, nid);
        }
    }

    /// Sends and replies that waited for a free descriptor. Replies to received requests go
    /// first and may use the last descriptors: they finish without needing another one, so
    /// they always free what they take. New sends leave [`Engine::reply_reserve`] descriptors
    /// free; otherwise two peers whose pools are full of requests waiting for each other's
    /// replies would wait forever.
    fn retry_waiting(&mut self, now: Instant) {
        while self.slots.available() > 0 {
            let Some(pos) = self.waiting.iter().position(|w| matches!(w, Waiting::Rx(..))) else { break };
            if let Some(Waiting::Rx(key, generation, rx, len)) = self.waiting.remove(pos) {
                self.retry_rx(now, key, generation, rx, len);
            }
        }
        while self.slots.available() > self.reply_reserve() {
            let Some(w) = self.waiting.pop_front() else { break };
            match w {
                Waiting::Send(msg) => self.launch_now(now, msg),
                Waiting::Rx(key, generation, rx, len) => self.retry_rx(now, key, generation, rx, len),
            }
        }
    }

    fn retry_rx(&mut self, now: Instant, key: usize, generation: u32, rx: u32, len: u32) {
        if self
            .conns
            .get(key)
            .is_some_and(|c| c.generation == generation && c.state == ConnState::Established)
        {
            self.handle_rx(now, key, rx, len);
        }
    }

    /// Descriptors new sends leave for replies to received requests.
    fn reply_reserve(&self) -> usize {
        (self.slots.total() as usize / 8).max(2)
    }

    // ------------------------------------------------------------------ posting

    /// Posts whatever the credit machine allows on a connection (`kiblnd_check_sends`).
    fn check_sends(&mut self, now: Instant, key: usize) {
        use crate::credits::Next;
        loop {
            let keepalive = self.cfg.tunables.keepalive_interval();
            let Some(conn) = self.conns.get_mut(key) else { return };
            if conn.state != ConnState::Established {
                return;
            }
            let keepalive_due = keepalive.is_some_and(|ka| now >= conn.last_send + ka);
            match conn.credits.next(keepalive_due) {
                Next::Stop => return,
                Next::NeedNoop => {
                    let peer = conn.peer;
                    match self.new_tx(now, peer, crate::wire::MsgType::Noop, Upper::None) {
                        Some(tx) => {
                            if let Some(t) = self.txs.get_mut(tx) {
                                t.noop = true;
                                t.queued = true;
                                t.conn = Some(key);
                                t.class = crate::credits::TxClass::NoCredit;
                            }
                            let nob = self.init_body(tx, crate::wire::init_noop);
                            self.set_nob(tx, nob);
                            if let Some(c) = self.conns.get_mut(key) {
                                c.credits.enqueue_noop(tx);
                            }
                        }
                        None => {
                            if let Some(c) = self.conns.get_mut(key) {
                                if !c.noop_starved {
                                    c.noop_starved = true;
                                    self.noop_starved.push(key);
                                }
                            }
                            return;
                        }
                    }
                }
                Next::DropNoop(tx) => {
                    if let Some(t) = self.txs.get_mut(tx) {
                        t.queued = false;
                    }
                    self.tx_maybe_done(tx);
                }
                Next::Post { tx, credits, credited } => {
                    if let Err(e) = self.post_tx(now, key, tx, credits) {
                        let noop = self.txs.get(tx).is_some_and(|t| t.noop);
                        if let Some(c) = self.conns.get_mut(key) {
                            c.credits.unpost(credits, credited, noop);
                        }
                        let _ = e;
                        self.abort_tx(tx, err(Errno::EIO, Health::LocalError));
                        self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
                        return;
                    }
                }
            }
        }
    }

    /// Packs the header (with the credits it returns) and posts the RDMA WRITEs and the SEND.
    fn post_tx(&mut self, now: Instant, key: usize, txk: usize, credits: u32) -> Result<(), FabricError> {
        use crate::fabric::{SendFlags, SendOp, SendWr};
        let Some(conn) = self.conns.get_mut(key) else {
            return Err(FabricError::NotFound { what: "connection" });
        };
        let Some(tx) = self.txs.get_mut(txk) else { return Err(FabricError::NotFound { what: "transmit" }) };
        let hdr = crate::wire::MsgHeader {
            version: crate::wire::IBLND_MSG_VERSION,
            msg_type: tx.msg_type,
            credits: credits.min(255) as u8,
            nob: tx.nob,
            cksum: 0,
            srcnid: self.cfg.nid,
            srcstamp: self.cfg.incarnation,
            dstnid: conn.peer,
            dststamp: conn.peer_incarnation,
        };
        let off = tx.slot as usize * IBLND_MSG_SIZE;
        let nob = tx.nob as usize;
        let msg = self.scratch.get_mut(..nob).ok_or(FabricError::InvalidArgument { what: "message size" })?;
        // Without a checksum only the header is written (`pack_header`'s contract): the body
        // stays where `build_*` put it, and only the 48 header bytes go back and forth.
        let cksum = self.cfg.tunables.cksum;
        let touched = if cksum { nob } else { crate::wire::MSG_HDR_SIZE.min(nob) };
        let _ = self.msgs.buf().read(off, msg.get_mut(..touched).unwrap_or_default());
        crate::wire::pack_header(msg, &hdr, cksum)
            .map_err(|_| FabricError::InvalidArgument { what: "message header" })?;
        let _ = self.msgs.buf().write(off, msg.get(..touched).unwrap_or_default());
        let send_sge = [self.msgs.sge(off, tx.nob)];
        let send = SendWr {
            wr_id: tx::wr_id(WrKind::Tx, tx.generation, txk as u32),
            op: SendOp::Send,
            sg_list: &send_sge,
            flags: SendFlags::SIGNALED,
        };
        if tx.rdma.is_empty() {
            // Most messages: the SEND alone, no list to build.
            conn.qp.post_send_at(std::slice::from_ref(&send), now)?;
        } else {
            let rdma_id = tx::wr_id(WrKind::Rdma, tx.generation, txk as u32);
            let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(tx.rdma.len() + 1);
            for w in &tx.rdma {
                wrs.push(SendWr {
                    wr_id: rdma_id,
                    op: SendOp::RdmaWrite { remote_addr: w.remote_addr, rkey: w.rkey },
                    sg_list: &w.sges,
                    flags: SendFlags::UNSIGNALED,
                });
            }
            wrs.push(send);
            conn.qp.post_send_at(&wrs, now)?;
        }
        let rdma_bytes: u64 = tx.rdma.iter().flat_map(|w| w.sges.iter()).map(|s| u64::from(s.length)).sum();
        tx.sending += 1;
        tx.queued = false;
        conn.sending += 1;
        conn.last_send = now;
        if !conn.active_txs.contains(&txk) {
            // A PUT's PUT_DONE is posted by the transmit that posted its PUT_REQ.
            conn.active_txs.push(txk);
        }
        self.stats.tx_msgs += 1;
        self.stats.tx_bytes += u64::from(tx.nob);
        self.stats.rdma_bytes += rdma_bytes;
        if tx.noop {
            self.stats.noops += 1;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ closing

    /// Closes a connection (`kiblnd_close_conn`): every queued transmit and every active one
    /// not still sending completes now with `error`; the rest complete on their flushes. If it
    /// was a connection attempt and no other attempt is left, the peer's waiting transmits fail.
    fn close_conn(&mut self, now: Instant, key: usize, error: LndError) {
        if let Some(peer) = self.close_conn_only(now, key, error) {
            self.fail_pending_if_unreachable(now, peer, error);
        }
    }

    /// [`Engine::close_conn`] without touching the peer's waiting transmits; returns the peer
    /// if the connection was still being set up (the caller decides: retry or fail them).
    fn close_conn_only(&mut self, now: Instant, key: usize, error: LndError) -> Option<Nid> {
        if self.conns.get(key)?.state == ConnState::Closing {
            return None;
        }
        self.handle_deferred_tx(now);
        let conn = self.conns.get_mut(key)?;
        // Completions already on the CQ happened before whatever closes the connection (the
        // peer acknowledged our last send, or sent its last message, before its DREQ, but the
        // CQ's notification may not have been seen yet): reap them first, so that a send the
        // peer received completes as sent and a message it sent is delivered, not dropped as
        // a late arrival on a closing connection. Not when completions are being reaped.
        if conn.state == ConnState::Established && !self.reaping {
            self.drain_cq(now, key);
            if self.conns.get(key).is_none_or(|c| c.state == ConnState::Closing) {
                return None;
            }
        }
        let conn = self.conns.get_mut(key)?;
        let was_connecting = matches!(conn.state, ConnState::ActiveConnect | ConnState::PassiveWait);
        let was_active_connect = conn.state == ConnState::ActiveConnect;
        let was_passive = conn.state == ConnState::PassiveWait;
        conn.state = ConnState::Closing;
        conn.close_error = Some(error);
        conn.zombie_deadline = now + ZOMBIE_GRACE;
        conn.early_rx.clear();
        let _ = conn.qp.modify(&QpModify::Err);
        let queued = conn.credits.drain();
        let active = std::mem::take(&mut conn.active_txs);
        let peer = conn.peer;
        if let Some(id) = conn.cm_id {
            if self.cm.disconnect(now, id).is_err() {
                self.cm.destroy(now, id);
            }
        }
        self.stats.conns_closed += 1;
        for t in queued.into_iter().chain(active) {
            self.abort_tx(t, error);
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            if was_active_connect {
                p.connecting = p.connecting.saturating_sub(1);
            }
            if was_passive {
                p.accepting = p.accepting.saturating_sub(1);
            }
            p.last_error = Some(error);
        }
        self.maybe_destroy(now, key);
        was_connecting.then_some(peer)
    }

    /// A peer with no connection and no attempt left fails the transmits waiting for it.
    fn fail_pending_if_unreachable(&mut self, _now: Instant, peer: Nid, error: LndError) {
        let live = self.peers.get(&peer).is_some_and(|p| {
            p.connecting > 0
                || p.accepting > 0
                || p.conns
                    .iter()
                    .any(|&k| self.conns.get(k).is_some_and(|c| c.state == ConnState::Established))
        });
        if live {
            return;
        }
        let pending: Vec<usize> =
            self.peers.get_mut(&peer).map(|p| p.pending.drain(..).collect()).unwrap_or_default();
        for t in pending {
            if let Some(tx) = self.txs.get_mut(t) {
                tx.queued = false;
                tx.fail(error);
            }
            self.tx_maybe_done(t);
        }
    }

    /// Destroys a closing connection once every work request came back.
    fn maybe_destroy(&mut self, now: Instant, key: usize) {
        if self.conns.get(key).is_some_and(|c| c.state == ConnState::Closing && c.is_quiet()) {
            self.destroy_conn(now, key);
        }
    }

    /// Frees a connection's QP, CQ and buffers. Transmits still sending (the device never
    /// flushed them) complete with the close error.
    fn destroy_conn(&mut self, _now: Instant, key: usize) {
        if !self.conns.contains(key) {
            return;
        }
        let conn = self.conns.remove(key);
        let error = conn.close_error.unwrap_or(err(Errno::ECONNABORTED, Health::LocalDropped));
        let stuck: Vec<usize> =
            self.txs.iter().filter(|(_, t)| t.conn == Some(key) && t.sending > 0).map(|(k, _)| k).collect();
        for t in stuck {
            if let Some(tx) = self.txs.get_mut(t) {
                tx.sending = 0;
                tx.conn = None;
                tx.fail(error);
            }
            self.tx_maybe_done(t);
        }
        // Transmits that finished already refer to no connection; clear dangling keys.
        for (_, t) in self.txs.iter_mut() {
            if t.conn == Some(key) {
                t.conn = None;
            }
        }
        self.by_qpn.remove(&conn.qp.qp_num());
        if let Some(id) = conn.cm_id {
            self.by_cm.remove(&id.0);
        }
        self.fd_changes.push(FdChange::Remove { fd: conn.cq.event_fd() });
        if self.by_cq_fd.get(&conn.cq.event_fd()) == Some(&key) {
            self.by_cq_fd.remove(&conn.cq.event_fd());
        }
        if let Some(p) = self.peers.get_mut(&conn.peer) {
            p.conns.retain(|&k| k != key);
        }
        drop(conn);
    }

    // ------------------------------------------------------------------ LNet-facing API

    /// Peers and their connections.
    pub fn peers(&self) -> Vec<PeerInfo> {
        self.peers
            .values()
            .map(|p| {
                let est: Vec<&Conn<D>> = p
                    .conns
                    .iter()
                    .filter_map(|&k| self.conns.get(k))
                    .filter(|c| c.state == ConnState::Established)
                    .collect();
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
                p.conns
                    .iter()
                    .filter_map(|&k| self.conns.get(k))
                    .filter(|c| c.state == ConnState::Established)
                    .map(|c| ConnDetail {
                        local_qpn: c.qp.qp_num(),
                        remote_qpn: c.remote_qpn,
                        credits: c.credits.counters(),
                        active_txs: c.active_txs.len(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Closes every connection to `peer`; its pending sends fail.
    pub fn close_peer(&mut self, now: Instant, peer: Nid) {
        let keys: Vec<usize> = self.peers.get(&peer).map(|p| p.conns.clone()).unwrap_or_default();
        for k in keys {
            self.close_conn(now, k, err(Errno::ECONNABORTED, Health::LocalDropped));
        }
        let pending: Vec<usize> =
            self.peers.get_mut(&peer).map(|p| p.pending.drain(..).collect()).unwrap_or_default();
        for t in pending {
            if let Some(tx) = self.txs.get_mut(t) {
                tx.queued = false;
                tx.fail(err(Errno::ECONNABORTED, Health::LocalDropped));
            }
            self.tx_maybe_done(t);
        }
    }

    /// Stops the interface: refuses new sends, fails everything pending, closes every
    /// connection. Call [`Engine::poll`] until [`Engine::is_idle`].
    pub fn shutdown(&mut self, now: Instant) {
        self.shutdown = true;
        self.cm.unlisten(self.service_id);
        let peers: Vec<Nid> = self.peers.keys().copied().collect();
        for p in peers {
            self.close_peer(now, p);
        }
        for w in std::mem::take(&mut self.waiting) {
            if let Waiting::Send(msg) = w {
                self.upcalls.send_done(msg.token, Err(err(Errno::ESHUTDOWN, Health::LocalDropped)));
            }
        }
    }

    /// Ends a shutdown that did not drain in time: destroys every connection at once (their
    /// transmits complete with their close errors) and fails whatever still waits.
    pub fn abandon(&mut self, now: Instant) {
        self.shutdown(now);
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.close_conn(now, k, err(Errno::ESHUTDOWN, Health::LocalDropped));
            self.destroy_conn(now, k);
        }
        let left: Vec<usize> = self.txs.iter().map(|(k, _)| k).collect();
        for t in left {
            if let Some(tx) = self.txs.get_mut(t) {
                tx.sending = 0;
            }
            self.abort_tx(t, err(Errno::ESHUTDOWN, Health::LocalDropped));
        }
    }

    /// Whether shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown
    }

    /// The CM id table size (leak checks).
    pub fn cm_live(&self) -> usize {
        self.cm.live()
    }

    fn conn_for_cm(&self, id: ConnId) -> Option<usize> {
        self.by_cm.get(&id.0).copied()
    }
}
