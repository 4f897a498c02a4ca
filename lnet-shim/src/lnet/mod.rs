//! LNet proper: network interfaces, memory descriptors, PUT/GET/ACK/REPLY, flow control, events.
//!
//! [`Lnet`] is the small LNet a userspace storage server links in (the kernel's `lnet/lnet/*`
//! reduced to what a server calls). Each network interface (NI) is driven by an LND plugged in
//! behind the [`Lnd`] trait: [`Lnet::add_ni`] starts it with LNet's [`LndUpcalls`] object, and
//! LNet never names the driver's crate.
//!
//! # The contract
//! * **Initiator side.** [`Lnet::md_bind`] describes caller memory; [`Lnet::put`] sends it to a
//!   remote portal, [`Lnet::get`] fetches into it. Every operation reports on the MD's
//!   [`EventSink`]: a PUT gives [`EventKind::Send`] and, with [`AckReq::Ack`], then
//!   [`EventKind::Ack`]; a GET gives `Send` then [`EventKind::Reply`]. The response event
//!   always comes after the SEND event (a response that arrives first is held back) and is the
//!   operation's last: **a failed send also delivers its ACK/REPLY event, with the same
//!   error**, so a caller waiting for the response never hangs on a failure LNet knows of.
//! * **Target side.** [`Lnet::me_attach`] + [`Lnet::md_attach`] (or [`Lnet::attach`]) post memory
//!   on a portal. An incoming PUT is matched (portal, match bits, initiator; see
//!   [`crate::matching`]) and the LND puts its payload into the MD (PUT event); an incoming GET is
//!   answered from the MD (GET event). A PUT that asked for an ACK is acknowledged unless the MD
//!   has [`MdOptions::ACK_DISABLE`](crate::matching::MdOptions::ACK_DISABLE).
//! * **Drops** (no match, too long without TRUNCATE, bad portal, not for this process) are
//!   counted per NI (by reason) and per peer, and the sender learns of them: a PUT or GET that
//!   moves by RDMA is answered PUT_NAK / GET_DONE(`-ENODATA`) by the LND, so the initiator's SEND
//!   (and ACK/REPLY) event carries `-ENODATA`. For a small (IMMEDIATE) PUT that asked for an ACK,
//!   lnet-shim answers with an ACK whose `mlength` is [`DROP_NAK_MLENGTH`] (an lnet-shim
//!   extension, "drop NAK"; kernel LNet never sends that value) and the initiator's ACK event
//!   carries `Err(Errno::ENODATA)`. A small PUT without ACK that is dropped is counted at the
//!   receiver only (LNet semantics: the sender has nothing to be told with).
//! * **Events** are delivered outside LNet's locks, in the order LNet produced them, one at a
//!   time (a callback may call back into `Lnet`). The event that makes an MD go away (auto-unlink
//!   on exhaustion, or a deferred [`Lnet::md_unlink`]) carries `unlinked = true` and is the MD's
//!   last; an MD unlinked while idle gets an [`EventKind::Unlink`] event.
//! * **Response timeouts** ([`LnetConfig::transaction_timeout`], 150 s by default): an ACK or
//!   REPLY still outstanding that long after its operation started is given up by LNet's
//!   monitor thread; the MD is unlinked and its responses end with `-ETIMEDOUT`.
//!   `lnet/timeout.rs` has the contract.
//! * **Lazy portals** ([`Lnet::set_lazy_portal`]): a PUT that matches nothing there waits, its
//!   payload in LNet's keeping, and is matched again, oldest first, whenever an MD is
//!   attached on the portal.  `lnet/lazy.rs` has the contract.
//! * **Flow control** as LNet does it: a message handed to an LND takes one of the peer's
//!   `peer_credits` and one of the NI's `credits`, and gives them back when the LND reports
//!   `send_done`; without credits it waits in a FIFO per peer, then per NI. Current and minimum
//!   credits (LNet's low-water marks, negative while messages wait) and queue lengths are in
//!   [`Lnet::stats`].
//! * **Self-sends** (a target NID that is one of this node's NIs) are handled inside LNet
//!   without an LND: the data is copied, events are as for a remote peer, no credits are used.
//! * **Shutdown** ([`Lnet::shutdown`], or dropping the last handle) fails queued messages,
//!   shuts the LNDs down (they report every pending send and receive with an error) and ends
//!   every operation still waiting for a response with an `-ESHUTDOWN` event.
//!
//! # Deviations from LNet
//! * No routing, no multi-rail selection, no health-based resends. Response timeouts count
//!   per outstanding response rather than per MD (`lnet/timeout.rs`).
//! * A PUT waiting on a lazy portal has its payload in LNet's keeping (at most
//!   [`LnetConfig::lazy_max_bytes`] over all of them), not in its LND's receive buffer: the
//!   LND and its credits are free meanwhile, and an RDMA PUT's SEND completes at the initiator
//!   before the match (only its ACK waits for it).
//! * A PUT with ACK reserves two of the MD's operations and a GET two (the operation and its
//!   response) when it is started; LNet consumes the second when the response arrives. A
//!   response is therefore never refused for lack of threshold, and an MD bound with exactly the
//!   operations it needs and [`Unlink::Auto`] goes away with its last event.
//! * ACKs and REPLYs must name an MD bound on this node with a response outstanding from that
//!   peer (LNet only checks the MD); anything else is dropped and counted as unexpected.
//! * A message whose LND peer is not its LNet source (a routed message) is dropped.

mod lazy;
mod md;
mod networks;
mod ni;
mod recv;
mod send;
mod stats;
mod timeout;

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError, Weak};
use std::time::Duration;

pub use lazy::{DEFAULT_LAZY_MAX_BYTES, LazyStats};
pub use md::{MD_LENGTH_MAX, Md};
pub use networks::{NetworkSpec, NetworksError, parse_networks, resolve_nid};
pub use stats::{DropCounts, LnetStats, MsgCounters, NiStats, NiStatus, PeerStats};
pub use timeout::DEFAULT_TRANSACTION_TIMEOUT;

use crate::event::{Errno, Event, EventKind, EventSink};
use crate::hash::FastMap;
use crate::hdr::{LnetHdr, WireHandle};
use crate::lnd::{Frags, Health, Lnd, LndError, LndSend, LndUpcalls};
use crate::matching::{
    DEFAULT_PORTALS, MatchEntry, MatchError, MdHandle, MeHandle, PORTALS_MAX, PortalTable, Unlink,
};
use crate::nid::{Net, Nid, ProcessId};

use self::lazy::Lazy;
use self::md::MdRecord;
use self::ni::{CreditState, Ni};
use self::recv::NiUpcalls;
use self::timeout::Monitor;

/// The `mlength` of an lnet-shim "drop NAK": an ACK saying that the PUT it answers was dropped
/// by the target (no match, too long, ...). The initiator's ACK event then carries
/// `Err(Errno::ENODATA)` and `mlength` 0. Kernel LNet never sends this value; no MD is that
/// long ([`MD_LENGTH_MAX`]), so no real ACK carries it either.
pub const DROP_NAK_MLENGTH: u32 = u32::MAX;

/// Whether a PUT asks for an ACK (`enum lnet_ack_req`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AckReq {
    /// `LNET_ACK_REQ`: the target acknowledges (an ACK event follows the SEND event).
    Ack,
    /// `LNET_NOACK_REQ`: no acknowledgement.
    NoAck,
}

/// How an [`Lnet`] is set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LnetConfig {
    /// This process's LNet pid; incoming messages for another pid are dropped. Default
    /// [`ProcessId::PID_LUSTRE`].
    pub pid: u32,
    /// Number of portals (indices `0..portals`), 1 to [`PORTALS_MAX`] (4096). Default
    /// [`DEFAULT_PORTALS`] (64, Lustre's `MAX_PORTALS`).
    pub portals: usize,
    /// The most payload bytes PUTs waiting on lazy portals may hold at once
    /// ([`Lnet::set_lazy_portal`]); a PUT that would pass it is dropped. Default
    /// [`DEFAULT_LAZY_MAX_BYTES`] (64 MiB); 0 makes every lazy portal drop as if it were not.
    pub lazy_max_bytes: u64,
    /// How long an ACK or REPLY is waited for before its MD is unlinked and the response
    /// ends with `-ETIMEDOUT` (LNet's `lnet_transaction_timeout`; `lnet/timeout.rs` has the
    /// contract). Default [`DEFAULT_TRANSACTION_TIMEOUT`] (150 s); `None` waits forever (as
    /// kernel LNet with `lnet_response_tracking=0`).
    pub transaction_timeout: Option<Duration>,
}

impl Default for LnetConfig {
    fn default() -> LnetConfig {
        LnetConfig {
            pid: ProcessId::PID_LUSTRE,
            portals: DEFAULT_PORTALS,
            lazy_max_bytes: DEFAULT_LAZY_MAX_BYTES,
            transaction_timeout: Some(DEFAULT_TRANSACTION_TIMEOUT),
        }
    }
}

/// Why an LNet call was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LnetError {
    /// [`Lnet::new`] with no portals or more than [`PORTALS_MAX`].
    #[error("{portals} portals: LNet needs 1 to {PORTALS_MAX} (Lustre's LNet has 64)")]
    BadPortals {
        /// The number asked for.
        portals: usize,
    },
    /// [`LnetConfig::transaction_timeout`] of zero.
    #[error("a transaction timeout of zero: give a positive duration, or none to wait for responses forever")]
    BadTransactionTimeout,
    /// The monitor thread (response timeouts) could not be started.
    #[error("cannot start LNet's monitor thread: {0}")]
    Monitor(#[source] std::io::Error),
    /// [`Lnet::shutdown`] has run (or is running).
    #[error("LNet is shut down")]
    ShutDown,
    /// No network interface is on the target's network.
    #[error("no network interface reaches {target} (no NI on network {})", target.nid.net())]
    NoRoute {
        /// The unreachable target.
        target: ProcessId,
    },
    /// [`Lnet::add_ni`] for a network that already has an interface.
    #[error("network {net} already has an interface, {existing}")]
    DuplicateNet {
        /// The network.
        net: Net,
        /// Its interface.
        existing: Nid,
    },
    /// [`Lnet::add_ni`] with `LNET_NID_ANY` or a NID on an unknown LND type.
    #[error("{nid} cannot be an interface NID")]
    BadNid {
        /// The refused NID.
        nid: Nid,
    },
    /// [`Lnet::add_ni`] with zero credits.
    #[error("credits ({credits}) and peer_credits ({peer_credits}) must both be at least 1")]
    BadCredits {
        /// The NI credits asked for.
        credits: u32,
        /// The per-peer credits asked for.
        peer_credits: u32,
    },
    /// The LND's start function failed.
    #[error("cannot start the LND for {nid}: {source}")]
    LndStart {
        /// The interface.
        nid: Nid,
        /// The LND's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The LND that started reports another NID than the one asked for.
    #[error("the LND started for {nid} reports NID {reported}")]
    LndNidMismatch {
        /// The NID asked for.
        nid: Nid,
        /// The NID the LND reports.
        reported: Nid,
    },
    /// A match-entry operation was refused (bad portal, stale ME, ME in use, ...).
    #[error(transparent)]
    Match(#[from] MatchError),
    /// The MD handle names no live MD (never valid, unlinked, or already going away).
    #[error("stale or invalid MD handle")]
    StaleMd,
    /// [`Lnet::put`] / [`Lnet::get`] on an MD attached to a match entry (LNet refuses too:
    /// initiators use [`Lnet::md_bind`]).
    #[error("the MD is attached to a match entry; PUT and GET need an MD from md_bind")]
    MdAttached,
    /// The MD has fewer operations left than the call needs (a PUT with ACK and a GET need 2).
    #[error("the MD has {left} operations left, this needs {needed}")]
    MdExhausted {
        /// Operations the call needs.
        needed: u32,
        /// Operations the MD has left.
        left: u32,
    },
    /// A fragment lies (partly) outside its buffer.
    #[error("fragment {index} lies outside its buffer")]
    BadFragment {
        /// The fragment's index in [`Md::frags`].
        index: usize,
    },
    /// The MD is longer than [`MD_LENGTH_MAX`] (4 GiB − 2): an LNet length is 32 bits, and
    /// `u32::MAX` is taken by the drop NAK.
    #[error("an MD of {length} bytes is longer than an LNet message can carry (at most {MD_LENGTH_MAX})")]
    MdTooLong {
        /// The MD's length.
        length: u64,
    },
    /// `max_size` was given for an MD that is not attached to a match entry.
    #[error("max_size applies only to MDs attached to match entries")]
    MaxSizeOnBoundMd,
}

/// Where LNet is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    ShuttingDown,
    Down,
}

/// A message LNet is working on: sent (or waiting for credits) or being received.
struct Msg {
    /// The NI it travels on.
    ni: usize,
    /// The LND peer: the target of a send, the source of a receive.
    peer: Nid,
    /// Credits it holds or waits for (sends through an LND only).
    credit: CreditState,
    /// The send, while it waits for credits (boxed: most sends never wait, and every message
    /// is moved into and out of the table once).
    queued: Option<Box<LndSend>>,
    /// What it is and what to do when it ends.
    kind: MsgKind,
}

/// What a message is, with what its completion needs.
enum MsgKind {
    /// Our PUT from bound MD `md`; `ack`: an ACK response is outstanding.
    Put { md: u64, template: Event, ack: bool },
    /// Our GET into bound MD `md` (a REPLY response is outstanding).
    Get { md: u64, template: Event },
    /// An ACK we send (no MD).
    Ack,
    /// A REPLY message we send for a header-only GET served from `md`; its end is the GET event.
    Reply { md: u64, template: Event },
    /// An incoming PUT into `md`; `ack`: the ACK to send once it is in.
    RecvPut { md: u64, template: Event, ack: Option<AckTo>, rdma: bool },
    /// An incoming GET served from `md`; `reply`: for a header-only GET, the REPLY to send
    /// (boxed, as rare as that GET).
    RecvGet { md: u64, template: Event, reply: Option<Box<ReplyTo>> },
    /// An incoming REPLY message into `md`, answering our GET `op`.
    RecvReply { md: u64, template: Event, op: u64 },
    /// The data of a PUT that waits on lazy `portal` (its number `id`), arriving into LNet's
    /// buffer ([`lazy`]).
    RecvDelayed { portal: u32, id: u64 },
}

/// Where and how to acknowledge a received PUT.
#[derive(Clone, Copy, Debug)]
struct AckTo {
    /// The PUT's initiator.
    to: ProcessId,
    /// Our process id the PUT was for.
    me: ProcessId,
    /// The PUT's `ack_wmd`.
    wmd: WireHandle,
    /// The PUT's match bits.
    match_bits: u64,
    /// Bytes accepted.
    mlength: u32,
}

/// The REPLY message answering a header-only GET.
#[derive(Clone, Debug)]
struct ReplyTo {
    /// The GET's initiator.
    to: ProcessId,
    /// Our process id the GET was for.
    me: ProcessId,
    /// The GET's `return_wmd`.
    wmd: WireHandle,
    /// The data.
    frags: Frags,
}

/// What to do once LNet's lock is released.
enum Outgoing {
    /// Hand `msg` to an LND.
    Lnd { lnd: Arc<dyn Lnd>, msg: LndSend },
    /// Deliver a self-send inside LNet.
    Local { ni: usize, msg: LndSend },
    /// Report a send as failed (no LND to take it).
    Fail { token: u64, error: LndError },
}

/// Work gathered under the lock: sends to start and events to deliver.
#[derive(Default)]
struct Work {
    sends: VecDeque<Outgoing>,
    events: Vec<(EventSink, Event)>,
}

/// Spare [`Work`] lists kept per thread, at most this many.
const SPARE_WORK_MAX: usize = 4;
/// A spare list longer than this is freed rather than kept.
const SPARE_WORK_CAPACITY: usize = 64;

thread_local! {
    /// Emptied [`Work`] lists for the next [`Inner::run`] on this thread: most calls gather an
    /// event or a send, and reusing the lists saves their allocations on every message. A
    /// stack, because `run` re-enters itself (a failed send; a callback that sends).
    static SPARE_WORK: std::cell::RefCell<Vec<Work>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Work {
    /// Empty lists, reused if this thread has some to spare.
    fn take() -> Work {
        SPARE_WORK.try_with(|s| s.borrow_mut().pop()).ok().flatten().unwrap_or_default()
    }

    /// Keeps these (emptied) lists for the next [`Work::take`] on this thread.
    fn recycle(mut self) {
        if self.sends.capacity() > SPARE_WORK_CAPACITY || self.events.capacity() > SPARE_WORK_CAPACITY {
            return;
        }
        self.sends.clear();
        self.events.clear();
        // Fails only while the thread exits: then the lists are simply freed.
        let _ = SPARE_WORK.try_with(|s| {
            let mut spare = s.borrow_mut();
            if spare.len() < SPARE_WORK_MAX {
                spare.push(self);
            }
        });
    }
}

/// Everything behind LNet's lock.
struct State {
    pid: u32,
    /// Our interface cookie in wire handles.
    cookie: u64,
    phase: Phase,
    table: PortalTable,
    /// MDs by id (the id is the [`MdHandle`] cookie).
    mds: FastMap<u64, MdRecord>,
    next_md: u64,
    msgs: FastMap<u64, Msg>,
    /// The MD of each operation whose ACK or REPLY is outstanding (its [`md::Pending`]), by
    /// the operation's token: the object cookie of the wire handle that PUT or GET carried, so
    /// a response names exactly the operation it answers.
    awaiting: FastMap<u64, u64>,
    next_token: u64,
    nis: Vec<Ni>,
    /// Lazy portals and the PUTs waiting on them.
    lazy: Lazy,
    /// Responses given up after the transaction timeout (`lnet/timeout.rs`).
    response_timeouts: u64,
}

/// The shared core of an [`Lnet`].
struct Inner {
    me: Weak<Inner>,
    state: Mutex<State>,
    /// Signalled whenever a change under `state` leaves no message in progress, if someone
    /// waits ([`Lnet::wait_quiet`]; counted in `quiet_waiters`, because a notify is a system
    /// call even with nobody waiting).
    quiet: Condvar,
    quiet_waiters: AtomicUsize,
    /// Signalled when a shutdown is complete (for a [`Lnet::shutdown`] that found another
    /// under way).
    down: Condvar,
    /// Events queued under `state` for whoever delivers next, in order.
    outbox: Mutex<VecDeque<(EventSink, Event)>>,
    /// How many events `outbox` holds (changed under its lock): a run that queues none looks
    /// here instead of locking the outbox.
    outbox_len: AtomicUsize,
    /// Held by the one thread delivering events; its batch.
    delivering: Mutex<VecDeque<(EventSink, Event)>>,
    /// The monitor thread, when responses time out (set once, right after creation).
    monitor: std::sync::OnceLock<Monitor>,
}

/// The delivery lock, held by the thread that delivers events (its batch inside).
type Deliverer<'a> = MutexGuard<'a, VecDeque<(EventSink, Event)>>;

/// Shuts LNet down when the last user handle goes (never from an LND thread: LNDs hold only
/// weak references).
struct Owner(Arc<Inner>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

/// An LNet instance: cheap to clone (clones share it), every method thread-safe.
///
/// Dropping the last clone shuts it down. Do not drop the last clone, or call
/// [`Lnet::shutdown`], from an event callback: the LNDs' threads are joined there.
#[derive(Clone)]
pub struct Lnet {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
}

impl std::fmt::Debug for Lnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.lock();
        let nids: Vec<String> = st.nis.iter().map(|n| n.nid.to_string()).collect();
        write!(f, "Lnet(pid {}, nis [{}], {:?})", st.pid, nids.join(", "), st.phase)
    }
}

impl Lnet {
    /// A new LNet with no network interface yet.
    ///
    /// # Errors
    ///
    /// [`LnetError::BadPortals`] when `config.portals` is 0 or above [`PORTALS_MAX`];
    /// [`LnetError::BadTransactionTimeout`] for a zero `config.transaction_timeout`;
    /// [`LnetError::Monitor`] when the monitor thread that times responses out cannot start.
    pub fn new(config: LnetConfig) -> Result<Lnet, LnetError> {
        if !(1..=PORTALS_MAX).contains(&config.portals) {
            return Err(LnetError::BadPortals { portals: config.portals });
        }
        if config.transaction_timeout == Some(Duration::ZERO) {
            return Err(LnetError::BadTransactionTimeout);
        }
        // A per-instance interface cookie (LNet's `ln_interface_cookie`): random, so wire
        // handles of a restarted node do not name the old instance's MDs.
        let cookie = {
            let mut h = RandomState::new().build_hasher();
            h.write_u32(config.pid);
            h.finish()
        };
        let inner = Arc::new_cyclic(|me| Inner {
            me: me.clone(),
            state: Mutex::new(State {
                pid: config.pid,
                cookie,
                phase: Phase::Running,
                table: PortalTable::new(config.portals),
                mds: FastMap::default(),
                next_md: 1,
                msgs: FastMap::default(),
                awaiting: FastMap::default(),
                next_token: 1,
                nis: Vec::new(),
                lazy: Lazy::new(config.lazy_max_bytes),
                response_timeouts: 0,
            }),
            quiet: Condvar::new(),
            quiet_waiters: AtomicUsize::new(0),
            down: Condvar::new(),
            outbox: Mutex::new(VecDeque::new()),
            outbox_len: AtomicUsize::new(0),
            delivering: Mutex::new(VecDeque::new()),
            monitor: std::sync::OnceLock::new(),
        });
        if let Some(timeout) = config.transaction_timeout {
            let monitor = Monitor::start(inner.me.clone(), timeout).map_err(LnetError::Monitor)?;
            let _ = inner.monitor.set(monitor);
        }
        Ok(Lnet { _owner: Arc::new(Owner(inner.clone())), inner })
    }

    /// This process's LNet pid.
    pub fn pid(&self) -> u32 {
        self.inner.lock().pid
    }

    /// Adds a network interface `nid` with LNet's `credits` (messages in flight over the NI) and
    /// `peer_credits` (messages in flight to one peer), started by `start`.
    ///
    /// `start` receives LNet's upcall object for this NI and returns the running LND (for
    /// example `|up| Driver::start(cfg, up).map(|d| Arc::new(d) as Arc<dyn Lnd>)`). It runs
    /// without LNet's lock held; upcalls may arrive before it returns. One NI per network.
    pub fn add_ni<F, E>(&self, nid: Nid, credits: u32, peer_credits: u32, start: F) -> Result<(), LnetError>
    where
        F: FnOnce(Arc<dyn LndUpcalls>) -> Result<Arc<dyn Lnd>, E>,
        E: std::error::Error + Send + Sync + 'static,
    {
        if nid.is_any() || nid.net().net_type().is_none() {
            return Err(LnetError::BadNid { nid });
        }
        if credits == 0 || peer_credits == 0 {
            return Err(LnetError::BadCredits { credits, peer_credits });
        }
        let index = {
            let mut st = self.inner.lock();
            if st.phase != Phase::Running {
                return Err(LnetError::ShutDown);
            }
            if let Some(existing) = st.nis.iter().find(|n| n.is_live() && n.nid.net() == nid.net()) {
                return Err(LnetError::DuplicateNet { net: nid.net(), existing: existing.nid });
            }
            st.nis.push(Ni::new(nid, credits, peer_credits));
            st.nis.len() - 1
        };
        let upcalls: Arc<dyn LndUpcalls> = Arc::new(NiUpcalls::new(self.inner.me.clone(), index));
        let started = start(upcalls);
        let mut st = self.inner.lock();
        let running = st.phase == Phase::Running;
        let Some(ni) = st.nis.get_mut(index) else {
            return Err(LnetError::ShutDown);
        };
        match started {
            Ok(lnd) if lnd.nid() != nid => {
                let reported = lnd.nid();
                ni.status = NiStatus::Failed;
                drop(st);
                lnd.shutdown();
                Err(LnetError::LndNidMismatch { nid, reported })
            }
            Ok(lnd) => {
                if !running {
                    ni.status = NiStatus::Down;
                    drop(st);
                    lnd.shutdown();
                    return Err(LnetError::ShutDown);
                }
                ni.lnd = Some(lnd);
                ni.status = NiStatus::Up;
                Ok(())
            }
            Err(e) => {
                ni.status = NiStatus::Failed;
                Err(LnetError::LndStart { nid, source: Box::new(e) })
            }
        }
    }

    /// The NIDs of the interfaces that are up, in the order they were added.
    pub fn nids(&self) -> Vec<Nid> {
        self.inner.lock().nis.iter().filter(|n| n.status == NiStatus::Up).map(|n| n.nid).collect()
    }

    /// Adds a match entry without an MD to `portal` (`LNetMEAttach`); it matches nothing until
    /// [`Lnet::md_attach`] gives it one.
    pub fn me_attach(&self, portal: u32, entry: MatchEntry) -> Result<MeHandle, LnetError> {
        let mut st = self.inner.lock();
        st.check_running()?;
        Ok(st.table.me_attach(portal, entry)?)
    }

    /// Attaches `md` to a match entry that has none (`LNetMDAttach`); with [`Unlink::Auto`] the
    /// MD unlinks itself when its threshold is used up (or `max_size` no longer fits).
    ///
    /// On a lazy portal ([`Lnet::set_lazy_portal`]) the PUTs waiting there are matched against
    /// it at once, oldest first, and their events are delivered before this returns (unless an
    /// event callback of this thread is running: then after it).
    pub fn md_attach(&self, me: MeHandle, md: Md, unlink: Unlink) -> Result<MdHandle, LnetError> {
        let mut st = self.inner.lock();
        st.check_running()?;
        let h = st.attach_md(me, md, unlink)?;
        self.resume_lazy(st, me);
        Ok(h)
    }

    /// After an MD was attached to `me` (the lock `st` still held): the PUTs waiting on its
    /// portal, if it is lazy and any wait, get their turn, under the same lock. Without any
    /// (the common case) no event can follow and nothing more is done.
    #[inline(always)]
    fn resume_lazy(&self, st: MutexGuard<'_, State>, me: MeHandle) {
        if !st.lazy.none_waiting() {
            self.inner.run_locked(st, |st, work| st.resume_after_attach(me, work));
        }
    }

    /// [`Lnet::me_attach`] and [`Lnet::md_attach`] in one step; nothing is left behind if
    /// either fails.
    pub fn attach(
        &self,
        portal: u32,
        entry: MatchEntry,
        md: Md,
        unlink: Unlink,
    ) -> Result<(MeHandle, MdHandle), LnetError> {
        let mut st = self.inner.lock();
        st.check_running()?;
        md.validate(true)?;
        let me = st.table.me_attach(portal, entry)?;
        match st.attach_md(me, md, unlink) {
            Ok(h) => {
                self.resume_lazy(st, me);
                Ok((me, h))
            }
            Err(e) => {
                let _ = st.table.me_unlink(me);
                Err(e)
            }
        }
    }

    /// Makes `portal` lazy (`LNetSetLazyPortal`): a PUT that matches no entry there waits for
    /// one instead of being dropped.
    ///
    /// Its payload is taken into a buffer of LNet's at once (its LND finishes the message as
    /// for any other), at most [`LnetConfig::lazy_max_bytes`] over all waiting PUTs; a PUT past
    /// that is dropped (`DropCounts::lazy_full`). Every [`Lnet::md_attach`] or [`Lnet::attach`]
    /// on the portal matches the waiting PUTs again, oldest first, and delivers those that
    /// match as on arrival (PUT event, ACK); one the MD refuses for its length is dropped. GETs
    /// that match nothing, and PUTs an MD refuses for their length, are dropped as on any
    /// portal. [`LnetStats::lazy`] counts what waits.
    ///
    /// # Errors
    ///
    /// [`LnetError::Match`] for a portal out of range; [`LnetError::ShutDown`].
    pub fn set_lazy_portal(&self, portal: u32) -> Result<(), LnetError> {
        let mut st = self.inner.lock();
        st.check_running()?;
        Ok(st.set_lazy(portal)?)
    }

    /// Makes `portal` drop what matches nothing again (`LNetClearLazyPortal`); the PUTs
    /// waiting there are dropped (counted as `lazy_discarded`; an IMMEDIATE PUT's initiator
    /// waiting for an ACK gets the drop NAK). A portal that is not lazy is left as it is.
    ///
    /// # Errors
    ///
    /// [`LnetError::Match`] for a portal out of range; [`LnetError::ShutDown`].
    pub fn clear_lazy_portal(&self, portal: u32) -> Result<(), LnetError> {
        self.inner.run(|st, work| {
            st.check_running()?;
            Ok(st.clear_lazy(portal, work)?)
        })
    }

    /// Unlinks a match entry and the MD attached to it, if any (`LNetMEUnlink`). The MD goes as
    /// with [`Lnet::md_unlink`].
    pub fn me_unlink(&self, me: MeHandle) -> Result<(), LnetError> {
        self.inner.run(|st, work| {
            st.check_running()?;
            let removed = st.table.me_unlink(me)?;
            if let Some(u) = removed {
                st.unlink_md(u.user_ptr, Errno::ECANCELED, work);
            }
            Ok(())
        })
    }

    /// Binds `md` for use as the source of [`Lnet::put`] or the sink of [`Lnet::get`]
    /// (`LNetMDBind`). With [`Unlink::Auto`] it goes away after the event that uses up its
    /// threshold; of the options only `TRUNCATE` applies to a bound MD (a REPLY longer than it
    /// is cut to fit instead of dropped, as in the kernel).
    pub fn md_bind(&self, md: Md, unlink: Unlink) -> Result<MdHandle, LnetError> {
        let mut st = self.inner.lock();
        st.check_running()?;
        md.validate(false)?;
        let id = st.new_md_id();
        st.mds.insert(id, MdRecord::new(md, None, unlink == Unlink::Auto));
        Ok(MdHandle::from_cookie(id))
    }

    /// Unlinks an MD (`LNetMDUnlink`). It stops matching at once. Responses it still waits for
    /// end with `-ECANCELED` events (each after its operation's SEND event). If no message is
    /// using it, an [`EventKind::Unlink`] event follows; otherwise the event of the last
    /// message using it carries `unlinked`. An MD already unlinked, explicitly or
    /// automatically, is [`LnetError::StaleMd`] even while a message still uses it.
    pub fn md_unlink(&self, md: MdHandle) -> Result<(), LnetError> {
        self.inner.run(|st, work| {
            st.check_running()?;
            let id = md.cookie();
            // An MD already unlinked (by a call before, or automatically when it matched) that
            // still waits for a message is going away: LNet's handle is invalid by then too.
            let rec = st.mds.get(&id).filter(|rec| !rec.unlinked).ok_or(LnetError::StaleMd)?;
            if let Some(h) = rec.attached {
                // Already gone from the table if it was auto-unlinked: nothing more to remove.
                let _ = st.table.md_unlink(h);
            }
            st.unlink_md(id, Errno::ECANCELED, work);
            Ok(())
        })
    }

    /// Sends the whole of bound MD `md` to `portal` of `target` (`LNetPut`), at remote `offset`,
    /// with `match_bits` and `hdr_data`. Events: SEND, then ACK if `ack` asks for one.
    #[allow(clippy::too_many_arguments, reason = "the arguments of LNetPut, in its order")]
    pub fn put(
        &self,
        md: MdHandle,
        ack: AckReq,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
        hdr_data: u64,
    ) -> Result<(), LnetError> {
        self.inner.run(|st, work| st.start_put(md, ack, target, portal, match_bits, offset, hdr_data, work))
    }

    /// Fetches up to the length of bound MD `md` from `portal` of `target` (`LNetGet`), at remote
    /// `offset`. The data lands at offset 0 of the MD. Events: SEND, then REPLY (its `mlength`
    /// is the bytes that arrived).
    pub fn get(
        &self,
        md: MdHandle,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
    ) -> Result<(), LnetError> {
        self.inner.run(|st, work| st.start_get(md, target, portal, match_bits, offset, work))
    }

    /// Counters per NI and per peer, with each LND's view of its peers ([`Lnd::peers`]).
    pub fn stats(&self) -> LnetStats {
        let (mut stats, lnds) = {
            let st = self.inner.lock();
            let lnds: Vec<Option<Arc<dyn Lnd>>> = st.nis.iter().map(|n| n.lnd.clone()).collect();
            (st.stats(), lnds)
        };
        // Asked without LNet's lock: an LND may take a moment to answer.
        for (ni, lnd) in stats.nis.iter_mut().zip(lnds) {
            if let Some(lnd) = lnd {
                if ni.status == NiStatus::Up {
                    ni.fatal_error = lnd.fatal_error();
                    ni.merge_lnd_peers(lnd.peers());
                }
            }
        }
        stats
    }

    /// Waits until no message is in progress (every send and receive has been reported by its
    /// LND: the last ACKs and REPLYs included, which finish after the peer's events) or until
    /// `timeout` has passed; true if LNet went quiet. For a server draining before shutdown,
    /// and for tests that check nothing leaked.
    pub fn wait_quiet(&self, timeout: Duration) -> bool {
        let st = self.inner.lock();
        // Counted under the lock: a change that empties `msgs` after this sees the waiter.
        self.inner.quiet_waiters.fetch_add(1, Ordering::Relaxed);
        let (st, _) = self
            .inner
            .quiet
            .wait_timeout_while(st, timeout, |st| !st.msgs.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        self.inner.quiet_waiters.fetch_sub(1, Ordering::Relaxed);
        st.msgs.is_empty()
    }

    /// Shuts LNet down: new calls are refused, messages waiting for credits fail, the LNDs are
    /// shut down (they report every pending send and receive with an error), and every
    /// operation still waiting for a response ends with an `-ESHUTDOWN` event. Idempotent; a
    /// call while another is under way (another thread's, or the last handle's drop) returns
    /// when that one is done.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Inner {
    /// The state lock, recovering from poisoning (every update is completed before anything
    /// that could panic; a poisoned lock still holds consistent bookkeeping).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` under the lock, queues its events in order, then (unlocked) starts its sends
    /// and delivers events.
    ///
    /// Events are delivered in the order they were queued under the lock, by one thread at a
    /// time. A run whose events find nothing queued before them and nobody delivering takes
    /// the delivery lock while it still holds the state lock (`try_lock`: it never waits for
    /// it there) and delivers its own events without going through the outbox; anything
    /// queued meanwhile is in the outbox, which it drains before letting go.
    fn run<R>(&self, f: impl FnOnce(&mut State, &mut Work) -> R) -> R {
        self.run_locked(self.lock(), f)
    }

    /// [`Inner::run`] with the state lock already taken (`st`), for a call that learns under
    /// the lock that it has events or sends to make.
    fn run_locked<R>(&self, st: MutexGuard<'_, State>, f: impl FnOnce(&mut State, &mut Work) -> R) -> R {
        let mut work = Work::take();
        let (r, deliverer) = {
            let mut st = st;
            let r = f(&mut st, &mut work);
            if st.msgs.is_empty() && self.quiet_waiters.load(Ordering::Relaxed) > 0 {
                self.quiet.notify_all();
            }
            let mut deliverer = None;
            if !work.events.is_empty() {
                // The outbox grows only under the state lock, which this thread holds.
                let first = self.outbox_len.load(Ordering::Acquire) == 0;
                match self.try_deliverer().filter(|_| first) {
                    Some(mut batch) => {
                        batch.extend(work.events.drain(..));
                        deliverer = Some(batch);
                    }
                    None => self.queue_events(&mut work.events),
                }
            }
            (r, deliverer)
        };
        self.finish(work, deliverer);
        r
    }

    /// Appends `events` to the outbox (under the state lock, so in order).
    fn queue_events(&self, events: &mut Vec<(EventSink, Event)>) {
        let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
        outbox.extend(events.drain(..));
        self.outbox_len.store(outbox.len(), Ordering::Release);
    }

    /// Starts the sends gathered under the lock, then delivers pending events (first those of
    /// `deliverer`'s batch, when this thread holds the delivery lock).
    fn finish(&self, mut work: Work, deliverer: Option<Deliverer<'_>>) {
        while let Some(out) = work.sends.pop_front() {
            match out {
                Outgoing::Lnd { lnd, msg } => {
                    let token = msg.token;
                    if let Err(e) = lnd.send(msg) {
                        self.run(|st, w| st.send_done(token, Err(e), w));
                    }
                }
                Outgoing::Local { ni, msg } => self.deliver_local(ni, msg),
                Outgoing::Fail { token, error } => self.run(|st, w| st.send_done(token, Err(error), w)),
            }
        }
        work.recycle();
        match deliverer {
            Some(batch) => self.deliver(batch),
            None => self.flush_events(),
        }
    }

    /// A self-send: delivered by the loopback copy engine with this NI as both ends.
    fn deliver_local(&self, ni: usize, msg: LndSend) {
        let up = NiUpcalls::new(self.me.clone(), ni);
        if self.lock().phase != Phase::Running {
            let token = msg.token;
            up.send_done(token, Err(LndError::new(Errno::ESHUTDOWN, Health::LocalDropped)));
            return;
        }
        let from = msg.hdr.src.nid;
        crate::loopback::deliver(&up, &up, from, msg, &crate::loopback::LoopbackConfig::default());
    }

    /// Delivers queued events in order, one thread at a time; a thread that finds another
    /// delivering leaves its events to it (the deliverer re-checks after letting go).
    fn flush_events(&self) {
        if self.outbox_len.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(batch) = self.try_deliverer() {
            self.deliver(batch);
        }
    }

    /// The delivery lock, unless another thread (or this one, further up) holds it.
    fn try_deliverer(&self) -> Option<Deliverer<'_>> {
        match self.delivering.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// As the deliverer: delivers `batch`, then whatever the outbox gathers, until it is empty;
    /// then lets go and looks once more (events queued by a thread that found it delivering
    /// just before it let go would otherwise wait for the next delivery).
    fn deliver<'a>(&'a self, mut batch: Deliverer<'a>) {
        loop {
            loop {
                while let Some((sink, event)) = batch.pop_front() {
                    sink.deliver(event);
                }
                // A stale zero is caught by the look under the lock after letting go.
                if self.outbox_len.load(Ordering::Acquire) == 0 {
                    break;
                }
                // The deliverer's batch lives in the delivery lock: swapped with the outbox,
                // the two queues trade their allocations instead of making new ones.
                let mut outbox = self.outbox.lock().unwrap_or_else(PoisonError::into_inner);
                std::mem::swap(&mut *batch, &mut *outbox);
                self.outbox_len.store(0, Ordering::Release);
            }
            drop(batch);
            if self.outbox.lock().unwrap_or_else(PoisonError::into_inner).is_empty() {
                return;
            }
            match self.try_deliverer() {
                Some(b) => batch = b,
                None => return,
            }
        }
    }

    /// The first call shuts the LNDs down and ends what they left open; a call while that is
    /// under way returns once it is done (until then the LNDs may still move data and report
    /// operations, so ending them here too would report them over too early).
    fn shutdown(&self) {
        let lnds = self.run(|st, work| {
            if st.phase != Phase::Running {
                return None;
            }
            st.phase = Phase::ShuttingDown;
            st.fail_queued(work);
            Some(st.nis.iter().filter_map(|n| n.lnd.clone()).collect::<Vec<_>>())
        });
        let Some(lnds) = lnds else {
            let st = self.lock();
            drop(
                self.down
                    .wait_while(st, |st| st.phase != Phase::Down)
                    .unwrap_or_else(PoisonError::into_inner),
            );
            return;
        };
        // An LND that panics in its shutdown must not leave the callers waiting above (and
        // the last handle's drop) hanging: LNet still goes down, then the panic goes on.
        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for lnd in lnds {
                lnd.shutdown();
            }
        }));
        self.run(|st, work| {
            st.abort_everything(work);
            st.phase = Phase::Down;
            for ni in &mut st.nis {
                if ni.status == NiStatus::Up {
                    ni.status = NiStatus::Down;
                }
            }
        });
        self.down.notify_all();
        if let Some(m) = self.monitor.get() {
            m.stop();
        }
        if let Err(panic) = stopped {
            std::panic::resume_unwind(panic);
        }
    }
}

impl State {
    fn check_running(&self) -> Result<(), LnetError> {
        if self.phase == Phase::Running { Ok(()) } else { Err(LnetError::ShutDown) }
    }

    fn new_md_id(&mut self) -> u64 {
        let id = self.next_md;
        self.next_md += 1;
        id
    }

    fn new_token(&mut self) -> u64 {
        let t = self.next_token;
        self.next_token += 1;
        t
    }

    /// Whether `nid` is one of our interfaces.
    fn is_local(&self, nid: Nid) -> bool {
        self.nis.iter().any(|n| n.is_live() && n.nid == nid)
    }

    /// The NI on `nid`'s network.
    fn route(&self, nid: Nid) -> Option<usize> {
        self.nis.iter().position(|n| n.status == NiStatus::Up && n.nid.net() == nid.net())
    }

    /// The wire handle a PUT's ACK or a GET's REPLY comes back to: operation `op`'s (kernel
    /// LNet sends the MD's handle and does not track operations; lnet-shim ends each
    /// operation with its own response, so the handle names the operation).
    fn wire_handle(&self, op: u64) -> WireHandle {
        WireHandle::new(self.cookie, op)
    }

    fn attach_md(&mut self, me: MeHandle, md: Md, unlink: Unlink) -> Result<MdHandle, LnetError> {
        md.validate(true)?;
        let id = self.new_md_id();
        let spec = md.spec(id);
        let h = self.table.md_attach(me, spec, unlink)?;
        self.mds.insert(id, MdRecord::new(md, Some(h), unlink == Unlink::Auto));
        Ok(MdHandle::from_cookie(id))
    }

    /// Fails every message still waiting for credits (shutdown).
    fn fail_queued(&mut self, work: &mut Work) {
        let mut tokens = Vec::new();
        for ni in &mut self.nis {
            tokens.extend(ni.drain_queues());
        }
        for t in tokens {
            if let Some(m) = self.msgs.get_mut(&t) {
                let (ni, peer, held) = (m.ni, m.peer, m.credit);
                m.credit = CreditState::None;
                m.queued = None;
                if held == CreditState::WaitNi {
                    if let Some(ni) = self.nis.get_mut(ni) {
                        ni.return_peer_credit(peer);
                    }
                }
            }
            self.send_done(t, Err(LndError::new(Errno::ESHUTDOWN, Health::LocalDropped)), work);
        }
    }

    /// Ends everything still open after the LNDs stopped: messages they did not report, and
    /// responses still awaited.
    fn abort_everything(&mut self, work: &mut Work) {
        self.fail_queued(work);
        self.discard_delayed();
        let mut tokens: Vec<u64> = self.msgs.keys().copied().collect();
        tokens.sort_unstable();
        let e = LndError::new(Errno::ESHUTDOWN, Health::LocalDropped);
        for t in tokens {
            let is_send = self.msgs.get(&t).is_some_and(|m| m.kind.is_send());
            if is_send {
                self.send_done(t, Err(e), work);
            } else {
                self.recv_done(t, Err(e), work);
            }
        }
        let mut ids: Vec<u64> = self.mds.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.cancel_pending(id, Errno::ESHUTDOWN, work);
        }
    }
}

impl MsgKind {
    fn is_send(&self) -> bool {
        matches!(self, MsgKind::Put { .. } | MsgKind::Get { .. } | MsgKind::Ack | MsgKind::Reply { .. })
    }
}

/// A blank event with the given identity fields; the MD, status and `unlinked` are filled in
/// when it is emitted.
#[allow(clippy::too_many_arguments)]
fn event_template(
    kind: EventKind,
    initiator: ProcessId,
    target: ProcessId,
    portal: u32,
    match_bits: u64,
    rlength: u64,
    mlength: u64,
    offset: u64,
    hdr_data: u64,
    hdr: &LnetHdr,
) -> Event {
    Event {
        kind,
        initiator,
        target,
        portal,
        match_bits,
        rlength,
        mlength,
        offset,
        md_handle: MdHandle::from_cookie(0),
        user_ptr: 0,
        hdr_data,
        msg_type: Some(hdr.msg_type()),
        status: Ok(()),
        unlinked: false,
    }
}

#[cfg(test)]
mod lazy_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod timeout_tests;
