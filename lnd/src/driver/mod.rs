//! The driver: the thin, threaded shell around the engine that implements [`Lnd`].
//!
//! Each scheduler thread owns an [`Engine`] (its connections, credit state and descriptors
//! need no lock); an interface has one, or `nscheds` (below). It sleeps in a mio loop over the
//! device's fds, every connection's completion-channel fd and a [`mio::Waker`]; it reads the
//! OS clock once per turn and passes it in; it sleeps until the engine's next deadline. While
//! traffic flows it keeps polling without sleeping for `busy_poll_usec` after its last piece of
//! work (an lnd-rs tunable), which saves a sleep and a wake-up per message hop; an idle
//! interface sleeps (after [`crate::fabric::Device::prepare_to_sleep`], so that same-host
//! peers writing to shared memory ring its doorbell). LNet's calls ([`Lnd::send`],
//! [`Lnd::close_peer`], queries) arrive on a lock-free queue (`crossbeam-queue`) and wake it;
//! upcalls into LNet run on it. A send made on the scheduler thread itself (a reply made in an
//! event callback) goes to a thread-local queue instead, which the engine empties right after
//! the receive whose upcall made it ([`Engine::set_early_sends`]): the reply is posted before
//! the turn's other completions are handled. The shared queue is taken between the two halves
//! of each turn's engine poll ([`Engine::poll_completions`], [`Engine::poll_finish`]), so
//! anything else queued meanwhile also leaves in the same turn.
//!
//! Completion queues are handled the way verbs consumers must: on a CQ fd event the engine
//! consumes the notification, drains the CQ in batches, re-arms it and drains it once more.
//! While the scheduler spins, a busy CQ is left unarmed and polled on every turn instead (no
//! notification, so no system call, per completion); before the scheduler sleeps it arms them
//! all ([`Engine::arm_cqs`], `engine::cq`). A spinning scheduler looks only at memory (frame
//! rings, polled CQs, the command queue) and asks the kernel (epoll, and a yield of the CPU to
//! any other runnable thread) only as often as [`pacing`] finds useful: epoll every 5 µs while
//! packets move through the device's fds, rarely once every peer is behind a same-host ring;
//! a yield every 5 µs while yields let another thread run, less often while none is waiting
//! for the CPU. After a poll that found nothing,
//! it does not even poll the engine until something could be there: a command, the engine's
//! next deadline, or the device saying it has work ([`Device::work_pending`]: for the soft
//! device, a frame in a ring, a socket not known to be drained, sends ready). An idle turn is
//! then a few loads instead of a full [`Engine::poll`], so a frame is picked up sooner.
//!
//! `nscheds`: the interface runs [`Tunables::scheduler_threads`] scheduler threads, each with
//! its own engine and a share of the peers (chosen by the peer's address), all on one device
//! ([`shard`]). A peer's connections, credits and transmits live on one thread, lock-free.

pub mod pacing;
pub mod shard;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::SegQueue;
use lnet_shim::event::Errno;
use lnet_shim::hash::FastMap;
use lnet_shim::lnd::{Health, Lnd, LndError, LndSend, LndUpcalls, PeerInfo};
use lnet_shim::nid::Nid;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::clock::{Clock, wall_clock_micros};
use crate::engine::{Engine, EngineConfig, EngineError, EngineStats, FdChange, LinkState, validate_send};
use crate::fabric::soft::{LiveCounts, SoftConfig, SoftDevice};
use crate::fabric::{Device, FabricError, FabricStats};
use crate::time::Instant;
use crate::tunables::Tunables;

use self::pacing::SpinPacing;
use self::shard::{Router, Shard, shard_of};

const WAKER: Token = Token(0);
const DEVICE_BASE: usize = 1;
const CQ_BASE: usize = 1 << 20;
/// How long a shutdown may take to drain before everything is abandoned.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// How long [`Lnd::shutdown`] waits for the scheduler threads: their grace, and time for the
/// abandon and the final drain after it.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// Longest sleep between turns (bounds the latency of anything not fd-driven).
const MAX_SLEEP: Duration = Duration::from_millis(250);
/// How long a query (peers, stats) waits for the scheduler.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a scheduler refreshes the peer list it shares for queries from its own event
/// callbacks (`Shared::peers_seen`).
const SNAPSHOT_INTERVAL: Duration = Duration::from_secs(1);

/// Which fabric the interface runs on.
#[derive(Clone, Debug)]
pub enum FabricChoice {
    /// The software RC device on real UDP sockets bound to the NID's address.
    Soft(SoftConfig),
    /// A real RDMA NIC through libibverbs.
    #[cfg(feature = "verbs")]
    Verbs(crate::fabric::verbs::VerbsConfig),
}

/// How to start a driver.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The interface's NID.
    pub nid: Nid,
    /// The `ko2iblnd` tunables (finalized).
    pub tunables: Tunables,
    /// The fabric.
    pub fabric: FabricChoice,
    /// Seed for the engine (PSNs, comm ids); `None` draws one from the OS.
    pub seed: Option<u64>,
}

impl DriverConfig {
    /// A driver on the software fabric with default tunables.
    pub fn soft(nid: Nid, tunables: Tunables) -> DriverConfig {
        DriverConfig { nid, tunables, fabric: FabricChoice::Soft(SoftConfig::default()), seed: None }
    }
}

/// Why a driver could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The fabric device could not be opened.
    #[error("cannot open the fabric: {source}")]
    Fabric {
        /// The interface.
        nid: Nid,
        /// Why.
        #[source]
        source: FabricError,
    },
    /// The engine refused the configuration (its error names the cause; LNet's own error
    /// around this one names the interface).
    #[error("{source}")]
    Engine {
        /// The interface.
        nid: Nid,
        /// Why.
        #[source]
        source: EngineError,
    },
    /// The OS refused a poller, waker or thread.
    #[error("cannot start the scheduler: {0}")]
    Io(#[from] io::Error),
}

/// Counters of a running driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// The engine's counters.
    pub engine: EngineStats,
    /// The fabric's counters.
    pub fabric: FabricStats,
    /// Connections alive.
    pub connections: usize,
    /// Descriptors in use / total.
    pub tx_descriptors: (usize, u32),
    /// Scheduler turns.
    pub turns: u64,
    /// Connection ids the CM holds (the listener's included).
    pub cm_live: usize,
    /// Whether the engine holds nothing: no connection, no transmit, no waiting work.
    pub idle: bool,
}

enum Cmd {
    Send(LndSend),
    ClosePeer(Nid),
    Peers(mpsc::Sender<Vec<PeerInfo>>),
    Stats(mpsc::Sender<DriverStats>),
    Shutdown,
}

/// What a scheduler thread shares with the application's threads.
struct Shared {
    queue: SegQueue<Cmd>,
    waker: Arc<Waker>,
    /// The scheduler may be blocked in its poller: only then does a command need the waker (an
    /// eventfd write, and an epoll round to clear it). Set before the scheduler's last look at
    /// the queue; read after the command is queued (both `SeqCst`: one of them sees the other).
    sleeping: AtomicBool,
    /// The scheduler has left its loop: nothing will take commands from `queue` any more, so
    /// whoever queues one after this reports it (set before the scheduler's final drain, read
    /// after a push, both `SeqCst`: a command is either drained there or seen here).
    exited: AtomicBool,
    /// The scheduler's peers as of its last query or its last [`SNAPSHOT_INTERVAL`] tick:
    /// what a query made on the scheduler's own thread (from an event callback) gets, since
    /// that thread cannot answer a queued one while it waits for it.
    peers_seen: Mutex<Vec<PeerInfo>>,
    /// The engine's [`LinkState`] as of its last poll ([`link_code`]), for
    /// [`Driver::link`] without asking the scheduler.
    link: AtomicU8,
    upcalls: Arc<dyn LndUpcalls>,
    /// The scheduler thread is done (set as it ends, panicking or not), with `finished_cv`:
    /// what [`Lnd::shutdown`] waits for, with a bound, before it joins the thread.
    finished: Mutex<bool>,
    finished_cv: Condvar,
}

/// A [`LinkState`] as stored in [`Shared::link`], ordered from best to worst.
fn link_code(l: LinkState) -> u8 {
    match l {
        LinkState::Active => 0,
        LinkState::Down => 1,
        LinkState::Fatal => 2,
    }
}

fn link_of_code(c: u8) -> LinkState {
    match c {
        0 => LinkState::Active,
        1 => LinkState::Down,
        _ => LinkState::Fatal,
    }
}

impl Shared {
    /// Ends every command left once the scheduler has exited (`local` first: the commands
    /// its own upcalls queued): a send fails with `ESHUTDOWN`, a query gets an empty answer.
    /// Safe to run on several threads at once: each command is popped by one of them.
    fn drain_exited(&self, mut local: impl FnMut() -> Option<Cmd>) {
        while let Some(cmd) = local().or_else(|| self.queue.pop()) {
            match cmd {
                Cmd::Send(msg) => self
                    .upcalls
                    .send_done(msg.token, Err(LndError::new(Errno::ESHUTDOWN, Health::LocalDropped))),
                Cmd::Peers(tx) => {
                    let _ = tx.send(Vec::new());
                }
                Cmd::ClosePeer(_) | Cmd::Stats(_) | Cmd::Shutdown => {}
            }
        }
    }
}

/// One scheduler thread and its engine's share of the peers.
struct SchedulerHandle {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

thread_local! {
    /// The scheduler running on this thread, if any (its `Shared`): a command it queues
    /// itself (from an upcall) needs no wake-up. A thread-local compare, because
    /// `thread::current()` would touch a reference count on every send.
    static RUNNING: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    /// Commands the scheduler running on this thread queued itself (an upcall's reply):
    /// a plain queue, no atomic operation on the way from LNet's callback to the engine.
    static LOCAL: RefCell<VecDeque<Cmd>> = const { RefCell::new(VecDeque::new()) };
}

/// The next command the running scheduler queued on its own thread.
fn pop_local() -> Option<Cmd> {
    LOCAL.with(|q| q.borrow_mut().pop_front())
}

/// The sends at the head of this thread's own queue ([`Engine::set_early_sends`]'s hook):
/// anything behind another command stays, in order.
fn early_sends(out: &mut Vec<LndSend>) {
    LOCAL.with(|q| {
        let mut q = q.borrow_mut();
        while matches!(q.front(), Some(Cmd::Send(_))) {
            if let Some(Cmd::Send(msg)) = q.pop_front() {
                out.push(msg);
            }
        }
    });
}

fn local_is_empty() -> bool {
    LOCAL.with(|q| q.borrow().is_empty())
}

impl SchedulerHandle {
    fn push(&self, cmd: Cmd) {
        // From the scheduler itself (an event callback sending a reply): its own queue, which
        // the loop sees before it sleeps; no eventfd write, no extra epoll round.
        if RUNNING.with(Cell::get) == Arc::as_ptr(&self.shared) {
            LOCAL.with(|q| q.borrow_mut().push_back(cmd));
            return;
        }
        self.shared.queue.push(cmd);
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.shared.exited.load(Ordering::SeqCst) {
            // Raced the scheduler's exit (`Lnd::send` saw `stopping` unset just before): the
            // command may sit behind its final drain, so this thread ends it.
            self.shared.drain_exited(|| None);
        } else if self.shared.sleeping.load(Ordering::SeqCst) {
            let _ = self.shared.waker.wake();
        }
    }

    /// Waits at most `timeout` for the scheduler thread to end; whether it has.
    fn wait_finished(&self, timeout: Duration) -> bool {
        let done = self.shared.finished.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, _) = self
            .shared
            .finished_cv
            .wait_timeout_while(done, timeout, |done| !*done)
            .unwrap_or_else(PoisonError::into_inner);
        *done
    }

    fn join(&self) {
        let handle = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// A running o2iblnd interface: an [`Lnd`] for LNet.
pub struct Driver {
    nid: Nid,
    stopping: AtomicBool,
    /// How long [`Lnd::shutdown`] waits for the schedulers to stop.
    shutdown_wait: Duration,
    /// One per scheduler thread; a peer's work goes to `schedulers[shard_of(peer)]`.
    schedulers: Vec<SchedulerHandle>,
    /// A handle on the software device, for leak checks after shutdown.
    soft: Option<SoftDevice>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Driver({}, {} schedulers)", self.nid, self.schedulers.len())
    }
}

impl Driver {
    /// Opens the fabric, starts the engines and their scheduler threads; upcalls go to
    /// `upcalls`.
    pub fn start(config: DriverConfig, upcalls: Arc<dyn LndUpcalls>) -> Result<Driver, DriverError> {
        let nid = config.nid;
        match config.fabric.clone() {
            FabricChoice::Soft(soft) => {
                let soft = SoftConfig {
                    name: format!("soft-{}", nid.addr()),
                    helper_spin: Duration::from_micros(u64::from(config.tunables.busy_poll_usec)),
                    ..soft
                };
                let dev = SoftDevice::open_udp(nid.addr(), soft)
                    .map_err(|source| DriverError::Fabric { nid, source })?;
                let handle = dev.clone();
                let mut driver = Driver::start_on(dev, config, upcalls)?;
                driver.soft = Some(handle);
                Ok(driver)
            }
            #[cfg(feature = "verbs")]
            FabricChoice::Verbs(vc) => {
                let dev = crate::fabric::verbs::VerbsDevice::open(vc)
                    .map_err(|source| DriverError::Fabric { nid, source })?;
                Driver::start_on(dev, config, upcalls)
            }
        }
    }

    /// Starts on an already opened device: [`Tunables::scheduler_threads`] engines, one per
    /// scheduler thread, sharing the device ([`shard`]).
    pub fn start_on<D: Device>(
        dev: D,
        config: DriverConfig,
        upcalls: Arc<dyn LndUpcalls>,
    ) -> Result<Driver, DriverError> {
        let nid = config.nid;
        let seed = config.seed.unwrap_or_else(crate::rng::os_seed);
        let busy_poll_usec = config.tunables.busy_poll_usec;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = config.tunables.scheduler_threads(u32::try_from(cpus).unwrap_or(u32::MAX)) as usize;
        let incarnation = wall_clock_micros();
        let mut polls = Vec::with_capacity(n);
        let mut wakers = Vec::with_capacity(n);
        for _ in 0..n {
            let poll = Poll::new()?;
            wakers.push(Arc::new(Waker::new(poll.registry(), WAKER)?));
            polls.push(poll);
        }
        let router = Arc::new(Router::new(wakers.clone()));
        let dev = Arc::new(dev);
        // One clock for every scheduler: they share the device, whose timers and transport
        // state take `now` from each of them, so their instants must have one epoch.
        let clock = Clock::new();
        let mut engines = Vec::with_capacity(n);
        for i in 0..n {
            let mut tunables = config.tunables.clone();
            // The transmit pool is split between the schedulers (o2iblnd: per CPU partition).
            tunables.ntx = tunables.ntx.div_ceil(n as u32);
            let shard_seed = seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut ecfg = EngineConfig::new(nid, tunables, incarnation, shard_seed);
            ecfg.cm_id_partition = (i as u32, n as u32);
            let device = Shard::new(dev.clone(), i, router.clone());
            let mut engine = Engine::new(device, ecfg, upcalls.clone())
                .map_err(|source| DriverError::Engine { nid, source })?;
            engine.set_early_sends(early_sends);
            engines.push(engine);
        }
        let mut driver = Driver {
            nid,
            stopping: AtomicBool::new(false),
            shutdown_wait: SHUTDOWN_WAIT,
            schedulers: Vec::new(),
            soft: None,
        };
        for (i, ((engine, poll), waker)) in engines.into_iter().zip(polls).zip(wakers).enumerate() {
            let shared = Arc::new(Shared {
                queue: SegQueue::new(),
                waker,
                upcalls: upcalls.clone(),
                sleeping: AtomicBool::new(false),
                exited: AtomicBool::new(false),
                peers_seen: Mutex::new(Vec::new()),
                link: AtomicU8::new(link_code(engine.link())),
                finished: Mutex::new(false),
                finished_cv: Condvar::new(),
            });
            let s2 = shared.clone();
            let name = if n == 1 {
                format!("o2iblnd-{}", nid.addr())
            } else {
                format!("o2iblnd-{i}-{}", nid.addr())
            };
            // On failure `driver` is dropped: the schedulers already started are shut down.
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || Scheduler::new(engine, poll, s2, clock, busy_poll_usec).run())?;
            driver.schedulers.push(SchedulerHandle { shared, thread: Mutex::new(Some(thread)) });
        }
        Ok(driver)
    }

    /// The scheduler that owns `peer`.
    fn scheduler_of(&self, peer: Nid) -> Option<&SchedulerHandle> {
        self.schedulers.get(shard_of(peer.addr(), self.schedulers.len()))
    }

    /// The objects still alive on the software device (QPs, MRs, CQs, PDs), when the driver
    /// runs on one. After [`Lnd::shutdown`] every count is zero unless something leaked (LNet
    /// buffers still held by the caller keep their cached registrations).
    pub fn soft_live_counts(&self) -> Option<LiveCounts> {
        self.soft.as_ref().map(SoftDevice::live_counts)
    }

    /// Fault-injection hook for tests and drills on the software fabric: takes the device
    /// port's link down or brings it back ([`SoftDevice::set_port_state`]) and wakes the
    /// schedulers to see it. `false` (and nothing done) on another fabric.
    #[doc(hidden)]
    pub fn set_soft_port_state(&self, state: crate::fabric::PortState) -> bool {
        let Some(dev) = &self.soft else { return false };
        dev.set_port_state(state);
        self.wake_schedulers();
        true
    }

    /// Fault-injection hook for tests and drills on the software fabric: fails the device
    /// ([`SoftDevice::inject_device_fatal`]) and wakes the schedulers to see it. `false` (and
    /// nothing done) on another fabric.
    #[doc(hidden)]
    pub fn inject_soft_device_fatal(&self) -> bool {
        let Some(dev) = &self.soft else { return false };
        dev.inject_device_fatal();
        self.wake_schedulers();
        true
    }

    /// The port's link as the schedulers last saw it (the worst of them: they share the
    /// device, and each learns of a port event on its next poll).
    pub fn link(&self) -> LinkState {
        let worst = self.schedulers.iter().map(|s| s.shared.link.load(Ordering::Acquire)).max().unwrap_or(0);
        link_of_code(worst)
    }

    fn wake_schedulers(&self) {
        for s in &self.schedulers {
            let _ = s.shared.waker.wake();
        }
    }

    /// Each scheduler's counters (asks every scheduler; `None` for one that does not answer in
    /// time, and for the caller's own scheduler when called from one of its event callbacks).
    pub fn scheduler_stats(&self) -> Vec<Option<DriverStats>> {
        self.ask_all(Cmd::Stats, |_| None)
    }

    /// Sends the query `ask` to every scheduler at once, then collects each one's answer
    /// (`None` for one that does not answer within [`QUERY_TIMEOUT`]). The scheduler whose
    /// thread this is (a query from an event callback) cannot answer while the thread waits:
    /// `own` answers for it, without waiting.
    fn ask_all<T>(&self, ask: fn(mpsc::Sender<T>) -> Cmd, own: fn(&Shared) -> Option<T>) -> Vec<Option<T>> {
        let running = RUNNING.with(Cell::get);
        let asked: Vec<_> = self
            .schedulers
            .iter()
            .map(|s| {
                if Arc::as_ptr(&s.shared) == running {
                    return Err(own(&s.shared));
                }
                let (tx, rx) = mpsc::channel();
                s.push(ask(tx));
                Ok(rx)
            })
            .collect();
        asked
            .into_iter()
            .map(|a| match a {
                Ok(rx) => rx.recv_timeout(QUERY_TIMEOUT).ok(),
                Err(answer) => answer,
            })
            .collect()
    }

    /// Counters of the whole interface: the schedulers' summed, the device's once (`None` if
    /// a scheduler does not answer in time).
    pub fn stats(&self) -> Option<DriverStats> {
        let mut all = self.scheduler_stats().into_iter();
        let mut total = all.next()??;
        for s in all {
            total.merge(&s?);
        }
        Some(total)
    }
}

impl DriverStats {
    /// Adds another scheduler's counters (the device's are shared: kept once).
    fn merge(&mut self, other: &DriverStats) {
        self.engine.merge(&other.engine);
        self.connections += other.connections;
        self.tx_descriptors.0 += other.tx_descriptors.0;
        self.tx_descriptors.1 += other.tx_descriptors.1;
        self.turns += other.turns;
        self.cm_live += other.cm_live;
        self.idle &= other.idle;
    }
}

impl Lnd for Driver {
    fn nid(&self) -> Nid {
        self.nid
    }

    fn send(&self, msg: LndSend) -> Result<(), LndError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(LndError::new(Errno::ESHUTDOWN, Health::LocalDropped));
        }
        validate_send(self.nid, &msg)?;
        match self.scheduler_of(msg.target) {
            Some(s) => s.push(Cmd::Send(msg)),
            None => return Err(LndError::new(Errno::ESHUTDOWN, Health::LocalDropped)),
        }
        Ok(())
    }

    fn peers(&self) -> Vec<PeerInfo> {
        // From an event callback, this thread's own scheduler answers with what it saw at most
        // SNAPSHOT_INTERVAL ago.
        let own = |s: &Shared| Some(s.peers_seen.lock().unwrap_or_else(PoisonError::into_inner).clone());
        self.ask_all(Cmd::Peers, own).into_iter().flatten().flatten().collect()
    }

    fn fatal_error(&self) -> bool {
        self.link() != LinkState::Active
    }

    fn close_peer(&self, peer: Nid) {
        if let Some(s) = self.scheduler_of(peer) {
            s.push(Cmd::ClosePeer(peer));
        }
    }

    /// Stops every scheduler and waits for them, 5 s at most in all (one stuck in
    /// an upcall is left to finish on its own). From one of the driver's own event callbacks
    /// (or a drop of the last handle there), it cannot wait for the calling scheduler, which
    /// goes on with its shutdown once the callback returns: it waits for the others only, and
    /// leaves the same-host registry to a later call from another thread (or to the device's
    /// last handle).
    fn shutdown(&self) {
        if !self.stopping.swap(true, Ordering::AcqRel) {
            for s in &self.schedulers {
                s.push(Cmd::Shutdown);
            }
        }
        let running = RUNNING.with(Cell::get);
        let mut all_stopped = true;
        let clock = Clock::new();
        for s in &self.schedulers {
            // Joining the calling thread itself would panic (EDEADLK) inside the callback.
            if Arc::as_ptr(&s.shared) == running {
                all_stopped = false;
                continue;
            }
            // One bound for all of them: a scheduler stuck in an upcall does not hang this.
            let left =
                self.shutdown_wait.saturating_sub(clock.now().saturating_duration_since(Instant::ZERO));
            if s.wait_finished(left) {
                s.join();
            } else {
                // Left running (detached if the driver goes): it still ends its transmits
                // when it moves again, and a later shutdown waits for it again.
                eprintln!("lnd: {}: a scheduler did not stop within {:?}", self.nid, self.shutdown_wait);
                all_stopped = false;
            }
        }
        // Nothing moves any more: leave the same-host registry now (cached registrations of
        // LNet buffers may keep the device itself alive until the process exits).
        if let Some(soft) = self.soft.as_ref().filter(|_| all_stopped) {
            soft.close_same_host();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Scheduler<D: Device> {
    engine: Engine<D>,
    poll: Poll,
    shared: Arc<Shared>,
    clock: Clock,
    cq_fds: FastMap<RawFd, usize>,
    turns: u64,
    busy_poll_usec: u32,
}

/// Why a scheduler's turns ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// A shutdown: the engine went idle, or its grace ran out.
    Shutdown,
    /// Its poller failed: it cannot wait for anything any more.
    PollFailed,
}

/// Marks its scheduler finished when dropped ([`Shared::finished`]).
struct Finished(Arc<Shared>);

impl Drop for Finished {
    fn drop(&mut self) {
        *self.0.finished.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.0.finished_cv.notify_all();
    }
}

impl<D: Device> Scheduler<D> {
    fn new(
        engine: Engine<D>,
        poll: Poll,
        shared: Arc<Shared>,
        clock: Clock,
        busy_poll_usec: u32,
    ) -> Scheduler<D> {
        Scheduler { engine, poll, shared, clock, cq_fds: FastMap::default(), turns: 0, busy_poll_usec }
    }

    /// Spins on memory alone (the command queue, [`Device::work_pending`]) until something may
    /// be there or `until` passes; the clock is read every few looks.
    fn spin_until_work(&mut self, until: Instant) {
        const LOOKS_PER_CLOCK_READ: u64 = 8;
        for looks in 1u64.. {
            if !self.shared.queue.is_empty() || self.engine.device().work_pending() {
                return;
            }
            if looks % LOOKS_PER_CLOCK_READ == 0 {
                self.turns += LOOKS_PER_CLOCK_READ;
                if self.clock.now() >= until {
                    return;
                }
            }
            std::hint::spin_loop();
        }
    }

    fn run(self) {
        // Set last, once the engine and its device objects are gone too, whatever happens
        // (a guard: also if an upcall of the final drain panics).
        let _finished = Finished(self.shared.clone());
        self.run_and_drain();
    }

    /// The turns, then the end of whatever is left (see [`Scheduler::run`]).
    fn run_and_drain(mut self) {
        RUNNING.with(|r| r.set(Arc::as_ptr(&self.shared)));
        // A panic on this thread (a bug here, in the engine or in an upcall) must neither drop
        // the transmits the engine holds nor leave commands in a queue nobody takes any more.
        let ran = panic::catch_unwind(AssertUnwindSafe(|| self.turns()));
        // A scheduler that stops for any reason but a shutdown (a panic, its poller failing)
        // leaves its peers unreachable through this interface for good: that is a fatal NI
        // (`Driver::link`, `Lnd::fatal_error`), as a failed device is.
        if !matches!(ran, Ok(Ended::Shutdown)) {
            self.shared.link.store(link_code(LinkState::Fatal), Ordering::Release);
        }
        if ran.is_err() {
            eprintln!("lnd: {}: scheduler stops: it panicked", self.engine.nid());
            let now = self.clock.now();
            // Best effort: the panic may have left the engine half-way through an update.
            if panic::catch_unwind(AssertUnwindSafe(|| self.engine.abandon(now))).is_err() {
                eprintln!("lnd: {}: ending its transmits panicked too", self.engine.nid());
            }
        }
        // Sends that raced the shutdown are reported, never dropped: those queued from now on
        // by the thread that queues them (`SchedulerHandle::push`).
        self.shared.exited.store(true, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.shared.drain_exited(pop_local);
        if let Err(payload) = ran {
            panic::resume_unwind(payload);
        }
    }

    /// The scheduler's turns, until shutdown or a failure of its poller; which it was.
    fn turns(&mut self) -> Ended {
        let device_fds = self.engine.device().pollable_fds();
        for (i, fd) in device_fds.iter().enumerate() {
            let _ =
                self.poll.registry().register(&mut SourceFd(fd), Token(DEVICE_BASE + i), Interest::READABLE);
        }
        let mut events = Events::with_capacity(256);
        let mut shutdown_deadline = None;
        let spin = Duration::from_micros(u64::from(self.busy_poll_usec));
        // While spinning, busy CQs are polled rather than armed (no eventfd per completion).
        self.engine.set_cq_poll_window(spin);
        let mut last_work = self.clock.now();
        // When to ask the kernel while spinning (the poller, a yield of the CPU).
        let mut pacing = SpinPacing::new(last_work);
        // Set while spinning after a poll that found nothing: until the next kernel poll, the
        // engine is polled again only when the device has something, a command came, or its
        // deadline (as of that poll) is due.
        let mut idle_until: Option<Instant> = None;
        let mut next_snapshot = self.clock.now();
        loop {
            self.turns += 1;
            if let Some(due) = idle_until.take() {
                self.spin_until_work(due.min(pacing.next_due()));
            }
            let now = self.clock.now();
            if now >= next_snapshot {
                self.publish_peers(&self.engine.peers());
                next_snapshot = now + SNAPSHOT_INTERVAL;
            }
            // LNet's sends are taken between the two halves of the engine's poll: after the
            // completions (whose upcalls may have queued replies on this thread), before the
            // transmit, so a send queued by an upcall this turn leaves in it (a reply made by
            // a receive's upcall has left already: `Engine::set_early_sends`).
            let turn = self.engine.poll_completions(now);
            let link = link_code(self.engine.link());
            if self.shared.link.load(Ordering::Relaxed) != link {
                self.shared.link.store(link, Ordering::Release);
            }
            self.take_commands(now, &mut shutdown_deadline);
            let worked = self.engine.poll_finish(now, turn);
            if worked {
                last_work = now;
            }
            self.apply_fd_changes();
            if let Some(deadline) = shutdown_deadline {
                if self.engine.is_idle() {
                    return Ended::Shutdown;
                }
                if now >= deadline {
                    self.engine.abandon(now);
                    return Ended::Shutdown;
                }
            }
            let mut spinning = false;
            let deadline = self.engine.next_deadline();
            let timeout = match deadline {
                // Queued by an upcall on this thread (no wake-up was sent for it).
                _ if !self.shared.queue.is_empty() || !local_is_empty() => Duration::ZERO,
                Some(t) if t <= now => Duration::ZERO,
                // busy_poll_usec: keep polling a while after the last piece of work.
                _ if now.saturating_duration_since(last_work) < spin => {
                    spinning = true;
                    Duration::ZERO
                }
                Some(t) => t.saturating_duration_since(now).min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            // No sleep (work already waiting, such as a command an upcall queued or a deadline
            // due, or spinning): the next turn comes at once. The rings and CQs need no system
            // call, so the kernel is asked only when `pacing` says (an epoll_wait per message
            // was on every round trip's path; see `pacing` for what each call costs).
            let yield_due = spinning && pacing.yield_due(now);
            if timeout.is_zero() && !yield_due && !pacing.poll_due(now) {
                if spinning {
                    if !worked && shutdown_deadline.is_none() {
                        // Everything this poll could see is done (completions reaped, frames
                        // handled): only the device, a command or a deadline brings more.
                        idle_until = Some(deadline.unwrap_or(Instant::FAR_FUTURE));
                    }
                    std::hint::spin_loop();
                }
                continue;
            }
            if yield_due {
                // Let any other runnable thread (the peer process, a copy helper, the
                // application) have this CPU, so that spinning never delays the work it waits
                // for on a machine with few cores; how long it took tells whether one ran (timed
                // on its own: `now` is from before this turn's work).
                let start = self.clock.now();
                std::thread::yield_now();
                pacing.yielded(start, self.clock.now());
            }
            if timeout.is_zero() && !pacing.poll_due(now) {
                continue;
            }
            // Before sleeping, the CQs polled while spinning are armed (a completion that
            // slipped in first is handled, and then there is no sleep), and the device makes
            // its same-host peers ring instead of just writing to shared memory; if something
            // arrived meanwhile, do not sleep.
            let timeout = if !timeout.is_zero() && self.engine.arm_cqs(now) {
                last_work = now;
                Duration::ZERO
            } else {
                timeout
            };
            let prepared = !timeout.is_zero() && self.engine.device().prepare_to_sleep();
            // Applications wake this thread from now on; a command queued before that is
            // seen here (the Dekker pair of `SchedulerHandle::push`).
            let asleep = prepared && {
                self.shared.sleeping.store(true, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                self.shared.queue.is_empty() && local_is_empty()
            };
            let timeout = if asleep { timeout } else { Duration::ZERO };
            let polled = self.poll.poll(&mut events, Some(timeout));
            self.shared.sleeping.store(false, Ordering::Relaxed);
            if prepared {
                self.engine.device().awake();
            }
            if let Err(e) = polled {
                if e.kind() != io::ErrorKind::Interrupted {
                    // The scheduler cannot wait for anything any more: end every transmit
                    // and receive it holds (and, below, every command queued later) rather
                    // than drop them with the engine.
                    eprintln!("lnd: {}: scheduler stops: polling failed: {e}", self.engine.nid());
                    self.engine.abandon(self.clock.now());
                    return Ended::PollFailed;
                }
            }
            let mut fd_events = false;
            for ev in events.iter() {
                let Token(t) = ev.token();
                if t >= CQ_BASE {
                    self.engine.cq_ready(t - CQ_BASE);
                } else if let Some(&fd) = t.checked_sub(DEVICE_BASE).and_then(|i| device_fds.get(i)) {
                    // mio is edge-triggered: the device may skip reading a drained socket
                    // until the next edge.
                    self.engine.device().fd_readable(fd);
                    fd_events = true;
                }
            }
            pacing.polled(now, fd_events, self.engine.device().fd_packets());
        }
    }

    /// Shares `peers` for queries made on this thread (`Shared::peers_seen`).
    fn publish_peers(&self, peers: &[PeerInfo]) {
        let mut seen = self.shared.peers_seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.clear();
        seen.extend_from_slice(peers);
    }

    /// Runs the commands LNet's threads (and this thread's upcalls) queued.
    fn take_commands(&mut self, now: Instant, shutdown_deadline: &mut Option<Instant>) {
        while let Some(cmd) = pop_local().or_else(|| self.shared.queue.pop()) {
            match cmd {
                Cmd::Send(msg) => {
                    let token = msg.token;
                    if let Err(e) = self.engine.send(now, msg) {
                        // Accepted by `Lnd::send`, refused now (shutdown raced it): report.
                        self.shared.upcalls.send_done(token, Err(e));
                    }
                }
                Cmd::ClosePeer(nid) => self.engine.close_peer(now, nid),
                Cmd::Peers(tx) => {
                    let peers = self.engine.peers();
                    self.publish_peers(&peers);
                    let _ = tx.send(peers);
                }
                Cmd::Stats(tx) => {
                    let _ = tx.send(DriverStats {
                        engine: self.engine.stats(),
                        fabric: self.engine.device().stats(),
                        connections: self.engine.connections(),
                        tx_descriptors: self.engine.tx_descriptors(),
                        turns: self.turns,
                        cm_live: self.engine.cm_live(),
                        idle: self.engine.is_idle(),
                    });
                }
                Cmd::Shutdown => {
                    self.engine.shutdown(now);
                    *shutdown_deadline = Some(now + SHUTDOWN_GRACE);
                }
            }
        }
    }

    fn apply_fd_changes(&mut self) {
        for change in self.engine.take_fd_changes() {
            match change {
                FdChange::Add { fd, token } => {
                    if self
                        .poll
                        .registry()
                        .register(&mut SourceFd(&fd), Token(CQ_BASE + token), Interest::READABLE)
                        .is_ok()
                    {
                        self.cq_fds.insert(fd, token);
                    }
                    // A completion may already be waiting on the new CQ.
                    self.engine.cq_ready(token);
                }
                FdChange::Remove { fd } => {
                    if self.cq_fds.remove(&fd).is_some() {
                        let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lnet_shim::frags::Frags;
    use lnet_shim::hdr::{LnetHdr, LnetMsg, PutMsg, WireHandle};
    use lnet_shim::lnd::{RecvDisposition, SendStatus};
    use lnet_shim::nid::ProcessId;

    use super::*;

    fn send(token: u64) -> Cmd {
        let nid = Nid::o2ib(std::net::Ipv4Addr::new(10, 0, 0, 1));
        let hdr = LnetHdr {
            dest: ProcessId::new(nid, ProcessId::PID_LUSTRE),
            src: ProcessId::new(nid, ProcessId::PID_LUSTRE),
            payload_length: 0,
            msg: LnetMsg::Put(PutMsg {
                ack_wmd: WireHandle::NONE,
                match_bits: token,
                hdr_data: 0,
                ptl_index: 4,
                offset: 0,
            }),
        };
        Cmd::Send(LndSend { target: nid, hdr, payload: Frags::new(), get_sink: None, token })
    }

    /// The engine's hook takes the sends at the head of the thread's own queue, in order, and
    /// leaves everything from the first other command on where it was.
    #[test]
    fn early_sends_take_the_leading_sends_only() {
        let nid = Nid::o2ib(std::net::Ipv4Addr::new(10, 0, 0, 2));
        LOCAL.with(|q| q.borrow_mut().extend([send(1), send(2), Cmd::ClosePeer(nid), send(3)]));
        let mut out = Vec::new();
        early_sends(&mut out);
        assert_eq!(out.iter().map(|s| s.token).collect::<Vec<_>>(), [1, 2]);
        early_sends(&mut out);
        assert_eq!(out.len(), 2, "nothing past the ClosePeer");
        assert!(matches!(pop_local(), Some(Cmd::ClosePeer(n)) if n == nid));
        early_sends(&mut out);
        assert_eq!(out.iter().map(|s| s.token).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(local_is_empty());
    }

    /// Records every `send_done`; receives are dropped.
    #[derive(Default)]
    struct SendsDone(Mutex<Vec<(u64, Result<SendStatus, LndError>)>>);

    impl LndUpcalls for SendsDone {
        fn recv(&self, _: Nid, _: &LnetHdr, _: bool) -> RecvDisposition {
            RecvDisposition::Drop
        }
        fn recv_done(&self, _: u64, _: Result<usize, LndError>) {}
        fn send_done(&self, token: u64, result: Result<SendStatus, LndError>) {
            self.0.lock().unwrap().push((token, result));
        }
    }

    /// Records every `send_done` (as [`SendsDone`]), and first runs `hook` in the one for
    /// `token`, on the scheduler thread: a panic, a shutdown or a wait in an upcall.
    struct HookOnSendDone {
        token: u64,
        hook: Box<dyn Fn() + Send + Sync>,
        done: SendsDone,
    }

    impl HookOnSendDone {
        fn new(token: u64, hook: impl Fn() + Send + Sync + 'static) -> Arc<HookOnSendDone> {
            Arc::new(HookOnSendDone { token, hook: Box::new(hook), done: SendsDone::default() })
        }

        /// The sends recorded so far, taken.
        fn take(&self) -> Vec<(u64, Result<SendStatus, LndError>)> {
            std::mem::take(&mut *self.done.0.lock().unwrap())
        }

        /// Every send recorded so far is one of `tokens`, and each of them ended exactly once,
        /// with an error.
        fn assert_each_ended_once_with_an_error(&self, tokens: &[u64]) {
            let done = self.take();
            let ended = |t: u64| done.iter().filter(|(token, r)| *token == t && r.is_err()).count();
            for &t in tokens {
                assert_eq!(ended(t), 1, "token {t} ends once, with an error: {done:?}");
            }
            assert_eq!(done.len(), tokens.len(), "nothing else: {done:?}");
        }
    }

    impl LndUpcalls for HookOnSendDone {
        fn recv(&self, _: Nid, _: &LnetHdr, _: bool) -> RecvDisposition {
            RecvDisposition::Drop
        }
        fn recv_done(&self, _: u64, _: Result<usize, LndError>) {}
        fn send_done(&self, token: u64, result: Result<SendStatus, LndError>) {
            if token == self.token {
                (self.hook)();
            }
            self.done.send_done(token, result);
        }
    }

    /// A driver at 10.0.0.1 on a simulated network (kept alive with it), upcalls to `up`.
    fn sim_driver(up: Arc<dyn LndUpcalls>) -> (crate::fabric::soft::SimNet, Driver) {
        let nid = Nid::o2ib(std::net::Ipv4Addr::new(10, 0, 0, 1));
        let net = crate::fabric::soft::SimNet::new(1, Duration::from_micros(10));
        let dev = SoftDevice::open_sim(&net, nid.addr(), SoftConfig::default());
        let mut tunables = Tunables::default();
        tunables.finalize().unwrap();
        let config =
            DriverConfig { nid, tunables, fabric: FabricChoice::Soft(SoftConfig::default()), seed: Some(1) };
        (net, Driver::start_on(dev, config, up).unwrap())
    }

    /// A send to `ip` with token `token`.
    fn send_to(ip: std::net::Ipv4Addr, token: u64) -> LndSend {
        let Cmd::Send(mut msg) = send(token) else { unreachable!() };
        msg.target = Nid::o2ib(ip);
        msg.hdr.dest = ProcessId::new(msg.target, ProcessId::PID_LUSTRE);
        msg
    }

    /// A panic on the scheduler thread (here in an upcall) ends the transmits its engine held
    /// and every send queued for it, then and later, with an error: before, the engine was
    /// dropped with them and later sends sat in the queue of a thread that was gone, none of
    /// them ever reported.
    #[test]
    fn a_panicking_scheduler_ends_every_send_it_held_or_was_given() {
        let up = HookOnSendDone::new(1, || panic!("the upcall for token 1 panics"));
        let (_net, driver) = sim_driver(up.clone());
        // Connecting to a port nobody answers: held by the engine for seconds.
        driver.send(send_to(std::net::Ipv4Addr::new(10, 0, 0, 2), 10)).unwrap();
        // The broadcast address does not resolve: failed at once, in the upcall that panics.
        driver.send(send_to(std::net::Ipv4Addr::BROADCAST, 1)).unwrap();
        assert!(driver.schedulers[0].wait_finished(Duration::from_secs(20)), "the scheduler ends");
        // A send after the scheduler is gone: refused, or reported.
        let late = driver.send(send_to(std::net::Ipv4Addr::new(10, 0, 0, 3), 11));
        let done = up.take();
        let count = |t: u64| done.iter().filter(|(token, r)| *token == t && r.is_err()).count();
        assert_eq!(count(10), 1, "the held transmit ends once with an error: {done:?}");
        assert_eq!(count(11) + usize::from(late.is_err()), 1, "the late send ends once: {done:?}");
        assert_eq!(done.len(), count(10) + count(11), "nothing else: {done:?}");
        assert!(driver.stats().is_none(), "no stats from a scheduler that is gone");
        // Its peers are unreachable through this interface from now on: a fatal NI.
        assert_eq!(driver.link(), LinkState::Fatal);
        assert!(driver.fatal_error());
        driver.shutdown();
    }

    /// `Lnd::shutdown` from an event callback returns, and the shutdown it started ends every
    /// transmit once: before, it joined its own scheduler thread, which panics ("Resource
    /// deadlock avoided"), inside the upcall.
    #[test]
    fn shutdown_from_an_upcall_returns_and_ends_every_transmit() {
        let (tx, returned) = mpsc::channel();
        let tx = Mutex::new(tx);
        let me: Arc<std::sync::OnceLock<std::sync::Weak<Driver>>> = Arc::default();
        let me2 = me.clone();
        // Calls `Lnd::shutdown` and says whether that returned (rather than panicked).
        let up = HookOnSendDone::new(1, move || {
            let driver = me2.get().and_then(std::sync::Weak::upgrade);
            let ran = panic::catch_unwind(AssertUnwindSafe(|| driver.iter().for_each(|d| d.shutdown())));
            let _ = tx.lock().unwrap().send(ran.is_ok());
        });
        let (_net, driver) = sim_driver(up.clone());
        let driver = Arc::new(driver);
        me.set(Arc::downgrade(&driver)).unwrap();
        driver.send(send_to(std::net::Ipv4Addr::new(10, 0, 0, 2), 10)).unwrap();
        driver.send(send_to(std::net::Ipv4Addr::BROADCAST, 1)).unwrap();
        let ok = returned.recv_timeout(Duration::from_secs(30)).expect("the upcall ran");
        assert!(ok, "Lnd::shutdown from an upcall returns");
        driver.shutdown();
        up.assert_each_ended_once_with_an_error(&[1, 10]);
    }

    /// `Driver::shutdown` returns within its bound while a scheduler is stuck (here in an
    /// upcall that blocks, against the rules): before, it joined the thread without a bound
    /// and hung as long as the upcall did. The stuck scheduler still ends its transmits once
    /// it moves again, and a later shutdown waits for it.
    #[test]
    fn shutdown_returns_in_bounded_time_while_a_scheduler_is_stuck() {
        let (release, rx) = mpsc::channel();
        let rx = Mutex::new(rx);
        // Blocks until `release` says so (or a minute passes).
        let up = HookOnSendDone::new(1, move || {
            let _ = rx.lock().unwrap().recv_timeout(Duration::from_secs(60));
        });
        let (_net, mut driver) = sim_driver(up.clone());
        driver.shutdown_wait = Duration::from_millis(100);
        let driver = Arc::new(driver);
        driver.send(send_to(std::net::Ipv4Addr::new(10, 0, 0, 2), 10)).unwrap();
        driver.send(send_to(std::net::Ipv4Addr::BROADCAST, 1)).unwrap();
        let (stopped, stopped_rx) = mpsc::channel();
        let d = driver.clone();
        let stopper = std::thread::spawn(move || {
            d.shutdown();
            let _ = stopped.send(());
        });
        let returned = stopped_rx.recv_timeout(Duration::from_secs(20));
        release.send(()).unwrap();
        stopper.join().unwrap();
        assert!(returned.is_ok(), "Driver::shutdown did not return while the scheduler was stuck");
        assert!(driver.schedulers[0].wait_finished(Duration::from_secs(20)), "it stops once released");
        driver.shutdown();
        up.assert_each_ended_once_with_an_error(&[1, 10]);
    }

    /// driver down reaches the queue after the scheduler's final drain: the thread that
    /// queued it reports it (before, it sat there unreported for good).
    #[test]
    fn a_send_queued_after_the_scheduler_exited_is_reported_once() {
        let up = Arc::new(SendsDone::default());
        let (_net, driver) = sim_driver(up.clone());
        driver.shutdown();
        assert!(driver.schedulers.iter().all(|s| s.shared.exited.load(Ordering::SeqCst)));
        // What that send does next, after the check.
        driver.schedulers[0].push(send(7));
        let done = std::mem::take(&mut *up.0.lock().unwrap());
        assert!(
            matches!(&done[..], [(7, Err(e))] if e.errno == Errno::ESHUTDOWN),
            "one ESHUTDOWN for the late send, got {done:?}"
        );
        assert!(driver.schedulers[0].shared.queue.is_empty());
        // And `Lnd::send` itself refuses from now on.
        let Cmd::Send(msg) = send(8) else { unreachable!() };
        assert!(driver.send(msg).is_err_and(|e| e.errno == Errno::ESHUTDOWN));
        assert!(up.0.lock().unwrap().is_empty(), "a refused send is not reported as well");
    }
}
