//! Events (`struct lnet_event`) and where they go: a bounded [`EventQueue`] or a callback.
//!
//! LNet reports every operation on a memory descriptor as an event: an incoming PUT or GET
//! completed on it, a REPLY or ACK arrived for it, a send from it finished, or it was unlinked.
//! Current LNet hands events to a per-MD handler function; older LNet (and this crate, for
//! callers that prefer to poll) also offers event queues (`LNetEQAlloc` / `LNetEQPoll`).
//!
//! ## Overflow
//!
//! LNet's event queue is a ring: a full queue overwrites its **oldest** unread event, and the
//! next `LNetEQPoll` returns the oldest surviving event with `-EOVERFLOW` so the consumer learns
//! that events were lost. [`EventQueue`] does the same: when full, the oldest event is dropped
//! and counted; [`EventQueue::take_overflow`] returns (and clears) the count of events lost since
//! it was last asked, and [`EventQueue::dropped`] the total. Unlike LNet, the capacity is not
//! rounded up to a power of two.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::hdr::LnetMsgType;
use crate::matching::MdHandle;
use crate::nid::ProcessId;

/// What happened (`enum lnet_event_kind`, with LNet's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `LNET_EVENT_GET` (1): an incoming GET completed on the MD (its data was sent).
    Get,
    /// `LNET_EVENT_PUT` (2): an incoming PUT completed; the data is in the MD.
    Put,
    /// `LNET_EVENT_REPLY` (3): the REPLY to this node's GET arrived and its data is in the MD.
    Reply,
    /// `LNET_EVENT_ACK` (4): the ACK for this node's PUT arrived.
    Ack,
    /// `LNET_EVENT_SEND` (5): an outgoing PUT or GET left the MD; the buffer may be reused.
    /// It does not mean delivery. The matching ACK/REPLY, if any, always comes after it (LNet
    /// holds back a response that arrives first; see [`crate::Lnet`]'s contract).
    Send,
    /// `LNET_EVENT_UNLINK` (6): the MD was unlinked explicitly while idle.
    Unlink,
}

impl EventKind {
    /// LNet's numeric value.
    pub const fn as_u32(self) -> u32 {
        match self {
            EventKind::Get => 1,
            EventKind::Put => 2,
            EventKind::Reply => 3,
            EventKind::Ack => 4,
            EventKind::Send => 5,
            EventKind::Unlink => 6,
        }
    }

    /// The kind for an LNet value.
    pub const fn from_u32(raw: u32) -> Option<EventKind> {
        match raw {
            1 => Some(EventKind::Get),
            2 => Some(EventKind::Put),
            3 => Some(EventKind::Reply),
            4 => Some(EventKind::Ack),
            5 => Some(EventKind::Send),
            6 => Some(EventKind::Unlink),
            _ => None,
        }
    }
}

/// A failure status as LNet reports it: a negative Linux errno (`-EIO`, `-ETIMEDOUT`, ...).
#[derive(Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{}", self.describe())]
pub struct Errno(i32);

impl Errno {
    /// `-ENOENT` (2).
    pub const ENOENT: Errno = Errno(-2);
    /// `-EIO` (5): generic I/O failure (failed send completion).
    pub const EIO: Errno = Errno(-5);
    /// `-ENOMEM` (12).
    pub const ENOMEM: Errno = Errno(-12);
    /// `-ENODEV` (19): the device failed.
    pub const ENODEV: Errno = Errno(-19);
    /// `-EINVAL` (22).
    pub const EINVAL: Errno = Errno(-22);
    /// `-ENODATA` (61): a GET matched nothing on the peer.
    pub const ENODATA: Errno = Errno(-61);
    /// `-EPROTO` (71): protocol violation.
    pub const EPROTO: Errno = Errno(-71);
    /// `-EOVERFLOW` (75).
    pub const EOVERFLOW: Errno = Errno(-75);
    /// `-EMSGSIZE` (90): too many fragments / too large.
    pub const EMSGSIZE: Errno = Errno(-90);
    /// `-ENETDOWN` (100): the port's link is down.
    pub const ENETDOWN: Errno = Errno(-100);
    /// `-ECONNABORTED` (103): the connection closed under the operation.
    pub const ECONNABORTED: Errno = Errno(-103);
    /// `-ECONNRESET` (104): the peer rejected the connection after accepting it.
    pub const ECONNRESET: Errno = Errno(-104);
    /// `-ESHUTDOWN` (108).
    pub const ESHUTDOWN: Errno = Errno(-108);
    /// `-ETIMEDOUT` (110).
    pub const ETIMEDOUT: Errno = Errno(-110);
    /// `-ECONNREFUSED` (111).
    pub const ECONNREFUSED: Errno = Errno(-111);
    /// `-EHOSTUNREACH` (113).
    pub const EHOSTUNREACH: Errno = Errno(-113);
    /// `-ESTALE` (116): the peer restarted.
    pub const ESTALE: Errno = Errno(-116);
    /// `-ECANCELED` (125).
    pub const ECANCELED: Errno = Errno(-125);

    const NAMES: [(Errno, &'static str); 18] = [
        (Errno::ENOENT, "ENOENT"),
        (Errno::EIO, "EIO"),
        (Errno::ENOMEM, "ENOMEM"),
        (Errno::ENODEV, "ENODEV"),
        (Errno::EINVAL, "EINVAL"),
        (Errno::ENODATA, "ENODATA"),
        (Errno::EPROTO, "EPROTO"),
        (Errno::EOVERFLOW, "EOVERFLOW"),
        (Errno::EMSGSIZE, "EMSGSIZE"),
        (Errno::ENETDOWN, "ENETDOWN"),
        (Errno::ECONNABORTED, "ECONNABORTED"),
        (Errno::ECONNRESET, "ECONNRESET"),
        (Errno::ESHUTDOWN, "ESHUTDOWN"),
        (Errno::ETIMEDOUT, "ETIMEDOUT"),
        (Errno::ECONNREFUSED, "ECONNREFUSED"),
        (Errno::EHOSTUNREACH, "EHOSTUNREACH"),
        (Errno::ESTALE, "ESTALE"),
        (Errno::ECANCELED, "ECANCELED"),
    ];

    /// The error for an errno given either way round (`110` or `-110`); `None` for 0, which is
    /// success.
    pub const fn from_raw(code: i32) -> Option<Errno> {
        if code == 0 {
            None
        } else if code > 0 {
            Some(Errno(-code))
        } else {
            Some(Errno(code))
        }
    }

    /// LNet's status convention: 0 is success, anything else the error [`Errno::from_raw`]
    /// makes of it.
    pub const fn status(rc: i32) -> Result<(), Errno> {
        match Errno::from_raw(rc) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// The negative value LNet stores (`-110` for `ETIMEDOUT`).
    pub const fn as_i32(self) -> i32 {
        self.0
    }

    /// The symbolic name (`ETIMEDOUT`) for the errnos this type names.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMES.iter().find(|(e, _)| *e == self).map(|(_, name)| *name)
    }

    fn describe(&self) -> String {
        match self.name() {
            Some(name) => format!("-{name} ({})", self.0),
            None => format!("errno {}", self.0),
        }
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Errno({})", self.describe())
    }
}

/// One event on a memory descriptor (`struct lnet_event`, nid4 identities).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The process that started the operation (the PUT/GET sender).
    pub initiator: ProcessId,
    /// The process the operation was aimed at.
    pub target: ProcessId,
    /// The portal index of the request.
    pub portal: u32,
    /// The request's match bits.
    pub match_bits: u64,
    /// Bytes the request asked for.
    pub rlength: u64,
    /// Bytes actually moved (less than `rlength` only if truncated).
    pub mlength: u64,
    /// Offset into the MD the operation used.
    pub offset: u64,
    /// The MD the event is about (stale once the MD is unlinked).
    pub md_handle: MdHandle,
    /// The MD's `user_ptr`.
    pub user_ptr: u64,
    /// The PUT's out-of-band data (meaningful for [`EventKind::Put`] only).
    pub hdr_data: u64,
    /// The LNet message behind the event, so a [`EventKind::Send`] handler can tell a PUT from
    /// a GET; `None` for [`EventKind::Unlink`].
    pub msg_type: Option<LnetMsgType>,
    /// Success, or the failure as a negative errno.
    pub status: Result<(), Errno>,
    /// The MD was unlinked: this is its last event (also set on [`EventKind::Unlink`]).
    pub unlinked: bool,
}

#[derive(Debug)]
struct Ring {
    events: VecDeque<Event>,
    capacity: usize,
    dropped_total: u64,
    dropped_unreported: u64,
    /// Threads blocked in [`EventQueue::wait`]: a push notifies the condvar only if there are
    /// some (with std's futex condvar every notify is a system call, waiters or not).
    waiters: usize,
}

#[derive(Debug)]
struct Shared {
    ring: Mutex<Ring>,
    ready: Condvar,
}

/// A bounded, thread-safe event queue (`LNetEQAlloc`). Clones share one queue.
///
/// When full, the oldest event is overwritten (see the [module notes](self#overflow)).
#[derive(Clone, Debug)]
pub struct EventQueue {
    shared: Arc<Shared>,
}

impl EventQueue {
    /// The most events [`EventQueue::new`] allocates room for up front.
    pub const PREALLOCATED: usize = 4096;

    /// A queue holding at most `capacity` unread events (at least 1). Room for up to
    /// [`EventQueue::PREALLOCATED`] of them is allocated at once, the rest as they arrive, so
    /// a large bound (even `usize::MAX`) costs nothing until events fill it.
    pub fn new(capacity: usize) -> EventQueue {
        let capacity = capacity.max(1);
        EventQueue {
            shared: Arc::new(Shared {
                ring: Mutex::new(Ring {
                    events: VecDeque::with_capacity(capacity.min(Self::PREALLOCATED)),
                    capacity,
                    dropped_total: 0,
                    dropped_unreported: 0,
                    waiters: 0,
                }),
                ready: Condvar::new(),
            }),
        }
    }

    /// The lock, recovering from poisoning: the ring holds plain data, every update to it is
    /// complete before anything that could panic, so a poisoned lock is still consistent.
    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.shared.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds an event, dropping the oldest unread one if the queue is full, and wakes one
    /// waiter.
    pub fn push(&self, event: Event) {
        let wake = {
            let mut ring = self.lock();
            if ring.events.len() >= ring.capacity {
                ring.events.pop_front();
                ring.dropped_total += 1;
                ring.dropped_unreported += 1;
            }
            ring.events.push_back(event);
            ring.waiters > 0
        };
        if wake {
            self.shared.ready.notify_one();
        }
    }

    /// The oldest unread event, if any, without blocking (`LNetEQGet`).
    pub fn poll(&self) -> Option<Event> {
        self.lock().events.pop_front()
    }

    /// The oldest unread event, waiting up to `timeout` for one (`LNetEQPoll` with a timeout).
    /// Returns `None` once `timeout` has passed with the queue still empty.
    pub fn wait(&self, timeout: Duration) -> Option<Event> {
        let mut ring = self.lock();
        if let Some(ev) = ring.events.pop_front() {
            return Some(ev);
        }
        // Counted under the lock, so a push either sees this waiter or came before the check.
        ring.waiters += 1;
        let (mut ring, _) = self
            .shared
            .ready
            .wait_timeout_while(ring, timeout, |r| r.events.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        ring.waiters -= 1;
        ring.events.pop_front()
    }

    /// Events lost to overflow since the last call, and resets that count (LNet's
    /// `-EOVERFLOW` from `LNetEQPoll`).
    pub fn take_overflow(&self) -> u64 {
        std::mem::take(&mut self.lock().dropped_unreported)
    }

    /// Events lost to overflow since the queue was created.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped_total
    }

    /// Unread events.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// Whether there are no unread events.
    pub fn is_empty(&self) -> bool {
        self.lock().events.is_empty()
    }

    /// The most unread events the queue holds.
    pub fn capacity(&self) -> usize {
        self.lock().capacity
    }
}

/// An event handler (LNet's `lnet_handler_t`): called in the delivering thread (often an LND's
/// scheduler thread), so it must be quick and must not block. It may call back into LNet
/// (put, get, attach, unlink: they never block), but must not shut LNet down, drop the last
/// [`Lnet`](crate::Lnet) handle, or wait for anything an LND thread has to answer.
/// [`Lnet::stats`](crate::Lnet::stats) may be called: the o2iblnd answers for the scheduler
/// running the callback from the peer list it shared at most a second before.
///
/// A callback that owns an [`Lnet`](crate::Lnet) clone keeps LNet alive: the MD holds the
/// callback, so dropping every other handle does not shut LNet down (its LND threads and ports
/// stay), and when the MD finally goes the callback is dropped on the delivering thread,
/// which must not be the last handle's drop. Call [`Lnet::shutdown`](crate::Lnet::shutdown)
/// explicitly when callbacks hold handles.
pub type EventCallback = Arc<dyn Fn(&Event) + Send + Sync>;

/// Where an MD's events go.
#[derive(Clone)]
pub enum EventSink {
    /// Into a queue the owner polls or waits on.
    Queue(EventQueue),
    /// To a handler, called synchronously for each event.
    Callback(EventCallback),
}

impl EventSink {
    /// A sink calling `f` for each event.
    pub fn callback(f: impl Fn(&Event) + Send + Sync + 'static) -> EventSink {
        EventSink::Callback(Arc::new(f))
    }

    /// Hands `event` to the queue or the handler.
    pub fn deliver(&self, event: Event) {
        match self {
            EventSink::Queue(q) => q.push(event),
            EventSink::Callback(f) => f(&event),
        }
    }
}

impl fmt::Debug for EventSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventSink::Queue(q) => f.debug_tuple("Queue").field(q).finish(),
            EventSink::Callback(_) => f.write_str("Callback(..)"),
        }
    }
}

impl From<EventQueue> for EventSink {
    fn from(q: EventQueue) -> EventSink {
        EventSink::Queue(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::thread;

    fn event(n: u64) -> Event {
        let me: ProcessId = ProcessId::new("10.0.0.1@o2ib".parse().unwrap(), 12345);
        Event {
            kind: EventKind::Put,
            initiator: me,
            target: me,
            portal: 4,
            match_bits: n,
            rlength: 100,
            mlength: 100,
            offset: 0,
            md_handle: MdHandle::from_cookie((1 << 32) | n),
            user_ptr: n,
            hdr_data: 0,
            msg_type: Some(LnetMsgType::Put),
            status: Ok(()),
            unlinked: false,
        }
    }

    #[test]
    fn events_come_out_in_order() {
        let q = EventQueue::new(16);
        assert!(q.is_empty());
        for n in 0..10 {
            q.push(event(n));
        }
        assert_eq!(q.len(), 10);
        let got: Vec<u64> = std::iter::from_fn(|| q.poll()).map(|e| e.match_bits).collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(q.poll(), None);
        assert_eq!(q.take_overflow(), 0);
    }

    /// Any capacity is accepted: only room for the first events is allocated up front
    /// (before, `with_capacity(capacity)` panicked with "capacity overflow" for `usize::MAX`
    /// and aborted the process on a failed allocation for a merely large bound).
    #[test]
    fn a_huge_capacity_is_a_bound_not_an_allocation() {
        let q = EventQueue::new(usize::MAX);
        assert_eq!(q.capacity(), usize::MAX);
        for n in 0..(EventQueue::PREALLOCATED as u64 + 10) {
            q.push(event(n));
        }
        assert_eq!((q.len(), q.dropped()), (EventQueue::PREALLOCATED + 10, 0));
        assert_eq!(q.poll().map(|e| e.match_bits), Some(0));
    }

    #[test]
    fn overflow_drops_oldest_and_is_reported() {
        let q = EventQueue::new(4);
        for n in 0..10 {
            q.push(event(n));
        }
        assert_eq!((q.len(), q.capacity()), (4, 4));
        assert_eq!(q.dropped(), 6);
        assert_eq!(q.take_overflow(), 6);
        assert_eq!(q.take_overflow(), 0);
        let got: Vec<u64> = std::iter::from_fn(|| q.poll()).map(|e| e.match_bits).collect();
        assert_eq!(got, [6, 7, 8, 9]);
        q.push(event(10));
        q.push(event(11));
        assert_eq!(q.take_overflow(), 0);
        assert_eq!(q.dropped(), 6);
        assert_eq!(EventQueue::new(0).capacity(), 1);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // measures that the bounded wait really waited
    fn wait_times_out_empty() {
        let q = EventQueue::new(4);
        let start = std::time::Instant::now();
        assert_eq!(q.wait(Duration::from_millis(20)), None);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(19), "returned after {waited:?}");
        assert!(waited < Duration::from_secs(10), "returned after {waited:?}");
        // An event already queued returns at once.
        q.push(event(1));
        assert_eq!(q.wait(Duration::from_secs(10)).unwrap().match_bits, 1);
    }

    #[test]
    #[allow(clippy::disallowed_methods)] // a missed notify would only show as a 30 s wait
    fn wait_wakes_when_another_thread_delivers() {
        let start = std::time::Instant::now();
        let q = EventQueue::new(4);
        let sink = EventSink::from(q.clone());
        let barrier = Arc::new(Barrier::new(2));
        let producer = {
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                for n in 0..3 {
                    sink.deliver(event(n));
                }
            })
        };
        barrier.wait();
        // Far longer than the test can take: returning at all means the push woke us.
        let mut got = Vec::new();
        while got.len() < 3 {
            let e = q.wait(Duration::from_secs(30)).expect("woken by the producer");
            got.push(e.match_bits);
        }
        producer.join().unwrap();
        assert_eq!(got, [0, 1, 2]);
        // A push notifies only counted waiters: had it missed this one, a wait would have run
        // out its 30 s.
        assert!(start.elapsed() < Duration::from_secs(25), "a push did not wake the waiter");
    }

    #[test]
    fn callback_sink_calls_the_handler() {
        let seen = Arc::new(AtomicU64::new(0));
        let sink = {
            let seen = Arc::clone(&seen);
            EventSink::callback(move |e: &Event| {
                seen.fetch_add(e.user_ptr, Ordering::SeqCst);
            })
        };
        sink.deliver(event(5));
        sink.deliver(event(7));
        assert_eq!(seen.load(Ordering::SeqCst), 12);
        assert_eq!(format!("{sink:?}"), "Callback(..)");
    }

    #[test]
    fn kinds_and_errnos_match_lnet() {
        for raw in 1..=6 {
            assert_eq!(EventKind::from_u32(raw).unwrap().as_u32(), raw);
        }
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(Errno::status(0), Ok(()));
        assert_eq!(Errno::status(-110), Err(Errno::ETIMEDOUT));
        assert_eq!(Errno::status(110), Err(Errno::ETIMEDOUT));
        assert_eq!(Errno::ECONNABORTED.as_i32(), -103);
        assert_eq!(Errno::ECONNRESET.to_string(), "-ECONNRESET (-104)");
        assert_eq!(Errno::ENODATA.to_string(), "-ENODATA (-61)");
        assert_eq!(Errno::from_raw(-4000).unwrap().to_string(), "errno -4000");
        assert_eq!(Errno::from_raw(i32::MIN).unwrap().as_i32(), i32::MIN);
        assert_eq!(Errno::from_raw(0), None);
    }
}
