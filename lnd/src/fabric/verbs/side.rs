//! The connection manager's side channel: 256-byte MADs over TCP.
//!
//! On real hardware the kernel owns each port's GSI (QP1) and the IB CM that runs on it; a
//! userspace process cannot send or receive CM MADs there without `/dev/infiniband/umad`
//! privileges and without fighting the kernel CM. librdmacm would hand the whole handshake to
//! the kernel instead, but it is not bound by `ibverbs-sys` 0.3.2, would add a second native
//! dependency, and would bypass this crate's own CM state machine (the one the software device
//! tests). So, as `rust-rdma.md` §5.1 recommends, the very same MADs travel over TCP to the
//! peer's IP on the o2iblnd service port (987 by default). The CM above cannot tell the
//! difference: [`crate::fabric::Device::send_mad`] and `recv_mad` keep their datagram
//! semantics (loss, duplication and reordering are allowed, and the CM retransmits).
//!
//! # Framing
//! Fixed 284-byte frames, no length prefix:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `"LNDM"` |
//! | 4 | version, 1 |
//! | 5 | reserved, 0 |
//! | 6..8 | sender's LID, big-endian (`0xffff` on RoCE) |
//! | 8..12 | sender's IPv4 address (the NID's; `0.0.0.0` = use the TCP peer address) |
//! | 12..28 | sender's port GID |
//! | 28..284 | the MAD |
//!
//! A frame with a bad magic or version closes the connection (counted as malformed). The
//! header's LID and GID are the sender's real fabric address: on InfiniBand the device learns
//! them here (see the `verbs` module docs, "Addresses").
//!
//! # Connections
//! * One non-blocking listener on `port`. Accepted connections are receive-only.
//! * One outgoing connection per peer IP, opened on the first send to it, send-only, from the
//!   local address named in our frames (when one is configured; see "Hostile peers"). A
//!   failed connect, a write error or EOF closes it; while frames are queued it is reopened
//!   after a backoff (100 ms doubling to 5 s). Frames older than 10 s are dropped instead of
//!   sent, and a peer's queue holds at most 1024 frames (more are dropped and counted): MADs
//!   are datagrams and the CM retransmits.
//! * An outgoing connection that makes no progress for 20 s while frames wait (a peer that
//!   vanished without a reset, a connect that hangs) is closed and reopened.
//! * Connections idle for 5 minutes (outgoing) or 10 minutes (incoming) are closed.
//! * Everything is driven by [`SideChannel::progress`]: sockets live in an internal
//!   `mio::Poll` whose fd ([`SideChannel::fd`]) is the one the driver waits on. Extra fds
//!   (the device's async-event fd) can share it ([`SideChannel::register_extra`]). All
//!   registrations are edge-triggered, so `progress` always drains what is readable, at most
//!   [`READ_BUDGET`] frames per connection per call: a connection with more waiting is read
//!   again by the next call, which [`SideChannel::next_deadline`] makes due at once.
//!
//! # Hostile peers
//! The channel is unauthenticated, like the CM on QP1: what a TCP connection proves is that
//! its peer can receive at its source address (the handshake), nothing more. The contract
//! towards a peer that sends whatever it likes:
//! * **Sender address.** The header's IPv4 address must be `0.0.0.0` or the TCP peer's
//!   ([`frame_sender`]); any other frame closes the connection, counted as
//!   [`SideStats::spoofed`] ([`FrameError::SenderMismatch`]). Only addresses are compared: the
//!   header has no port, and an incoming connection's source port is the sender's ephemeral
//!   (or reserved) one, never its listener. So that honest senders pass on hosts with several
//!   addresses, outgoing connections are bound to the address in our own header. A MAD is
//!   reported as coming from the checked address, and a peer can teach the learned-address
//!   table ([`Learned`]) only its own entry; the table's contract (GID index, bound, eviction)
//!   is on [`Learned`].
//! * **Slots.** At most [`MAX_IN_CONNS`] incoming connections, [`MAX_IN_PER_IP`] from one
//!   address. A new connection is never refused for want of a slot: it closes the oldest
//!   connection from its own address when that address is at its cap, else (all slots taken)
//!   the oldest incoming connection (both counted as [`SideStats::evicted`]). Oldest means
//!   accepted first, something a peer cannot influence by what it sends: a connection loses
//!   its slot only after [`MAX_IN_PER_IP`] − 1 later connections from its own address, or
//!   after [`MAX_IN_CONNS`] − 1 later connections in all. So a hog at its address's cap only
//!   evicts itself, and pushing an honest connection out takes thousands of handshakes in
//!   the moment the sender needs to write its frame; a peer evicted between frames
//!   reconnects on its next send.
//! * **Partial frames.** A connection must complete each frame within [`FRAME_DEADLINE`] (of
//!   its accept for the first frame, of the frame's first byte for later ones), or it is
//!   closed ([`SideStats::frame_timeouts`]; checked every second). A trickle of bytes holds
//!   a slot for seconds, not until the idle timeout; an honest sender connects only with a
//!   frame to send and writes each whole. A connection between frames is closed after the
//!   idle timeout, or sooner by eviction.
//! * **Receive queue.** Received MADs are queued per sender address, at most
//!   [`RX_PER_PEER_MAX`] each (more from that sender are dropped, [`SideStats::rx_peer_full`]),
//!   [`RX_QUEUE_MAX`] in all, and [`SideChannel::recv`] takes them round-robin across senders
//!   (in order within one). When the whole queue is full, a frame from a sender whose queue
//!   is at least two shorter than the longest pushes the longest queue's newest MAD out
//!   ([`SideStats::rx_pushed_out`]); otherwise it is dropped ([`SideStats::rx_dropped`]). A
//!   flooder thus drops its own frames: it can push out only MADs of a sender with more
//!   queued than itself, and delays another sender's next MAD by at most one of its own.
//! * **Wire input never panics:** frames are fixed-size and decoded field by field; every
//!   table and queue above is bounded.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::fabric::{Gid, Mad, PortAddr};
use crate::time::Instant;

/// The o2iblnd service port, used for the side channel by default.
pub const DEFAULT_MAD_PORT: u16 = 987;
/// Frame magic.
pub const FRAME_MAGIC: [u8; 4] = *b"LNDM";
/// Frame format version.
pub const FRAME_VERSION: u8 = 1;
/// Header bytes before the MAD.
pub const FRAME_HEADER_LEN: usize = 28;
/// Bytes per frame.
pub const FRAME_LEN: usize = FRAME_HEADER_LEN + 256;
/// Frames queued per peer before new ones are dropped.
pub const PEER_QUEUE_MAX: usize = 1024;
/// Received MADs kept in all (see "Hostile peers" in the module docs for who is dropped).
pub const RX_QUEUE_MAX: usize = 4096;
/// Received MADs kept per sender address; more from that sender are dropped. The CM drains
/// the queue at every progress and one peer has a few MADs in flight per connection, so an
/// honest peer stays far below this.
pub const RX_PER_PEER_MAX: usize = 64;
/// Learned peer addresses kept (see [`Learned`]).
pub const LEARNED_MAX: usize = 65_536;
/// A learned entry heard from within this long is live: it is not evicted to make room, and
/// the GID it claimed stays indexed to it. An entry is needed from the frame that teaches it
/// until the RTR a moment later (the CM handshake takes seconds), so this is generous.
pub const LEARNED_HOLD: Duration = Duration::from_secs(120);
/// Incoming connections kept; a new one beyond closes the oldest (module docs, "Slots").
pub const MAX_IN_CONNS: usize = 4096;
/// Incoming connections kept from one source address; a new one beyond closes that address's
/// oldest. An honest peer has one (two while its reconnect races our noticing the old one
/// closed).
pub const MAX_IN_PER_IP: usize = 4;
/// How long an incoming connection has to complete a frame: counted from its accept for the
/// first frame, from the frame's first byte for each later one. An honest sender connects
/// only with a frame to send and writes each 284-byte frame whole, so only a stalled or
/// hostile connection misses it; it is closed ([`SideStats::frame_timeouts`]) by the next
/// sweep (at most a second late).
pub const FRAME_DEADLINE: Duration = Duration::from_secs(5);
/// Frames read from one connection per [`SideChannel::progress`] before the others get theirs.
pub const READ_BUDGET: usize = 64;

const LISTENER: Token = Token(0);
const EXTRA: Token = Token(1);
const FIRST_CONN: usize = 2;
const EVENTS_CAPACITY: usize = 256;
const MAX_PEERS: usize = 4096;
const FRAME_TTL: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const IDLE_OUT: Duration = Duration::from_secs(300);
const IDLE_IN: Duration = Duration::from_secs(600);
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// An outgoing connection with frames waiting and no progress for this long is reopened.
const STALL: Duration = Duration::from_secs(20);

/// The sender fields of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The sender's IPv4 address (`0.0.0.0`: unknown, use the connection's).
    pub ip: Ipv4Addr,
    /// The sender's port GID.
    pub gid: Gid,
    /// The sender's LID (`0xffff` on RoCE).
    pub lid: u16,
}

/// Why a frame was refused (each closes its connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first four bytes are not `"LNDM"`.
    #[error("bad frame magic")]
    BadMagic,
    /// An unknown format version.
    #[error("unsupported frame version {0}")]
    BadVersion(u8),
    /// The header names a sender address other than the TCP peer's.
    #[error("frame names sender {claimed} but came from {peer}")]
    SenderMismatch {
        /// The address in the header.
        claimed: Ipv4Addr,
        /// The TCP peer's address.
        peer: Ipv4Addr,
    },
}

/// Why a well-formed frame from an accepted sender was not queued for the CM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RxDrop {
    /// Its sender already has [`RX_PER_PEER_MAX`] MADs queued.
    #[error("the sender already has its share of the receive queue")]
    PeerQueueFull,
    /// The receive queue is full and no sender has a longer queue than this one's.
    #[error("the receive queue is full")]
    QueueFull,
}

/// Why [`Learned::learn`] refused an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LearnError {
    /// The table holds [`LEARNED_MAX`] entries and all are live (heard within
    /// [`LEARNED_HOLD`]).
    #[error("the learned-address table is full of live entries")]
    Full,
}

/// Encodes one frame.
pub fn encode_frame(h: &FrameHeader, mad: &Mad) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    let (head, body) = f.split_at_mut(FRAME_HEADER_LEN);
    head[0..4].copy_from_slice(&FRAME_MAGIC);
    head[4] = FRAME_VERSION;
    head[6..8].copy_from_slice(&h.lid.to_be_bytes());
    head[8..12].copy_from_slice(&h.ip.octets());
    head[12..28].copy_from_slice(&h.gid.0);
    body.copy_from_slice(mad);
    f
}

/// Decodes one frame.
pub fn decode_frame(f: &[u8; FRAME_LEN]) -> Result<(FrameHeader, Mad), FrameError> {
    let (head, body) = f.split_at(FRAME_HEADER_LEN);
    if head[0..4] != FRAME_MAGIC {
        return Err(FrameError::BadMagic);
    }
    if head[4] != FRAME_VERSION {
        return Err(FrameError::BadVersion(head[4]));
    }
    let lid = u16::from_be_bytes([head[6], head[7]]);
    let ip = Ipv4Addr::new(head[8], head[9], head[10], head[11]);
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&head[12..28]);
    let mut mad = [0u8; 256];
    mad.copy_from_slice(body);
    Ok((FrameHeader { ip, gid: Gid(gid), lid }, mad))
}

/// The address a frame received from TCP peer `peer` comes from: `peer`, if the header names
/// it or names no one (`0.0.0.0`); any other claim is [`FrameError::SenderMismatch`].
pub fn frame_sender(h: &FrameHeader, peer: Ipv4Addr) -> Result<Ipv4Addr, FrameError> {
    if h.ip.is_unspecified() || h.ip == peer {
        Ok(peer)
    } else {
        Err(FrameError::SenderMismatch { claimed: h.ip, peer })
    }
}

/// Fabric addresses (GID, LID) learned from side-channel frames, per sender IPv4 address.
///
/// Contract:
/// * Only [`SideChannel`] writes it, and only under the address a frame was checked to come
///   from ([`frame_sender`]): a peer can teach, and overwrite, its own entry and no other (a
///   frame that passes that check teaches even if the receive queue then drops it).
/// * The GID index ([`Learned::ip_of_gid`]) names the address that claimed a GID first. Another
///   address claiming the same GID (two NIDs on one HCA port, or a peer posing as another) is
///   stored under its own address, but takes the index over only once the holder is no longer
///   live (not heard from for [`LEARNED_HOLD`]); the holder's own frames keep it live.
/// * At most [`LEARNED_MAX`] entries. A new address takes the place of the least recently
///   heard entry if that one is no longer live; else it is refused ([`LearnError::Full`]) and
///   its frame is dropped. So the table never locks new peers out for good, and filling it
///   takes as many addresses, each with a TCP connection, heard within [`LEARNED_HOLD`].
#[derive(Debug)]
pub struct Learned {
    by_ip: HashMap<Ipv4Addr, LearnedEntry>,
    by_gid: HashMap<Gid, Ipv4Addr>,
    by_age: BTreeSet<(Instant, Ipv4Addr)>,
    max: usize,
}

#[derive(Clone, Copy, Debug)]
struct LearnedEntry {
    addr: PortAddr,
    heard: Instant,
}

impl Default for Learned {
    fn default() -> Learned {
        Learned::with_max(LEARNED_MAX)
    }
}

impl Learned {
    /// An empty table.
    pub fn new() -> Learned {
        Learned::default()
    }

    fn with_max(max: usize) -> Learned {
        Learned { by_ip: HashMap::new(), by_gid: HashMap::new(), by_age: BTreeSet::new(), max }
    }

    /// What `ip` taught us of its fabric address.
    pub fn get(&self, ip: &Ipv4Addr) -> Option<PortAddr> {
        self.by_ip.get(ip).map(|e| e.addr)
    }

    /// The address a GID is indexed to (see the type's docs).
    pub fn ip_of_gid(&self, gid: &Gid) -> Option<Ipv4Addr> {
        self.by_gid.get(gid).copied()
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.by_ip.len()
    }

    /// Whether nothing was learned.
    pub fn is_empty(&self) -> bool {
        self.by_ip.is_empty()
    }

    /// Records that `ip`, heard at `now`, has fabric address `addr`. `Ok(Some(holder))` when
    /// `addr`'s GID stays indexed to another live address, `holder`.
    pub fn learn(
        &mut self,
        ip: Ipv4Addr,
        addr: PortAddr,
        now: Instant,
    ) -> Result<Option<Ipv4Addr>, LearnError> {
        if !self.by_ip.contains_key(&ip) && self.by_ip.len() >= self.max {
            let Some(&(heard, oldest)) = self.by_age.first() else { return Err(LearnError::Full) };
            if now.saturating_duration_since(heard) <= LEARNED_HOLD {
                return Err(LearnError::Full);
            }
            self.remove(oldest);
        }
        if let Some(old) = self.by_ip.get(&ip).copied() {
            self.by_age.remove(&(old.heard, ip));
            if old.addr.gid != addr.gid && self.by_gid.get(&old.addr.gid) == Some(&ip) {
                self.by_gid.remove(&old.addr.gid);
            }
        }
        self.by_ip.insert(ip, LearnedEntry { addr, heard: now });
        self.by_age.insert((now, ip));
        match self.by_gid.get(&addr.gid).copied() {
            Some(holder) if holder != ip && self.is_live(holder, now) => Ok(Some(holder)),
            _ => {
                self.by_gid.insert(addr.gid, ip);
                Ok(None)
            }
        }
    }

    fn is_live(&self, ip: Ipv4Addr, now: Instant) -> bool {
        self.by_ip.get(&ip).is_some_and(|e| now.saturating_duration_since(e.heard) <= LEARNED_HOLD)
    }

    fn remove(&mut self, ip: Ipv4Addr) {
        if let Some(e) = self.by_ip.remove(&ip) {
            self.by_age.remove(&(e.heard, ip));
            if self.by_gid.get(&e.addr.gid) == Some(&ip) {
                self.by_gid.remove(&e.addr.gid);
            }
        }
    }
}

/// Received MADs, queued per sender and handed out round-robin (module docs, "Receive queue").
///
/// Invariants: a sender is in `order` once, and in `by_len` with its queue's length, exactly
/// while its queue in `by_ip` is non-empty; `total` is the sum of the queues' lengths.
#[derive(Debug)]
struct RxQueue {
    by_ip: HashMap<Ipv4Addr, VecDeque<Mad>>,
    order: VecDeque<Ipv4Addr>,
    by_len: BTreeSet<(usize, Ipv4Addr)>,
    total: usize,
    per_peer: usize,
    max: usize,
}

impl RxQueue {
    fn new(per_peer: usize, max: usize) -> RxQueue {
        RxQueue {
            by_ip: HashMap::new(),
            order: VecDeque::new(),
            by_len: BTreeSet::new(),
            total: 0,
            per_peer,
            max,
        }
    }

    /// Queues `mad` from `ip`; `Ok(Some(victim))` when it pushed `victim`'s newest MAD out.
    fn push(&mut self, ip: Ipv4Addr, mad: Mad) -> Result<Option<Ipv4Addr>, RxDrop> {
        let len = self.by_ip.get(&ip).map_or(0, VecDeque::len);
        if len >= self.per_peer {
            return Err(RxDrop::PeerQueueFull);
        }
        let mut pushed_out = None;
        if self.total >= self.max {
            // Only a queue longer than this sender's will be after the push gives way, so the
            // longest queue only ever shrinks and two senders never take turns displacing.
            match self.by_len.last().copied() {
                Some((longest, victim)) if longest > len.saturating_add(1) => {
                    self.pop_back(victim, longest);
                    pushed_out = Some(victim);
                }
                _ => return Err(RxDrop::QueueFull),
            }
        }
        let q = self.by_ip.entry(ip).or_default();
        q.push_back(mad);
        if len == 0 {
            self.order.push_back(ip);
        } else {
            self.by_len.remove(&(len, ip));
        }
        self.by_len.insert((q.len(), ip));
        self.total = self.total.saturating_add(1);
        Ok(pushed_out)
    }

    /// Drops the newest MAD of `ip`, whose queue is `len` long.
    fn pop_back(&mut self, ip: Ipv4Addr, len: usize) {
        let Some(q) = self.by_ip.get_mut(&ip) else { return };
        if q.pop_back().is_none() {
            return;
        }
        self.total = self.total.saturating_sub(1);
        self.by_len.remove(&(len, ip));
        if q.is_empty() {
            self.by_ip.remove(&ip);
            self.order.retain(|&o| o != ip);
        } else {
            self.by_len.insert((q.len(), ip));
        }
    }

    /// The oldest MAD of the sender whose turn it is.
    fn pop(&mut self) -> Option<(Ipv4Addr, Mad)> {
        while let Some(ip) = self.order.pop_front() {
            let Some(q) = self.by_ip.get_mut(&ip) else { continue };
            let len = q.len();
            let Some(mad) = q.pop_front() else {
                self.by_ip.remove(&ip);
                continue;
            };
            self.total = self.total.saturating_sub(1);
            self.by_len.remove(&(len, ip));
            if q.is_empty() {
                self.by_ip.remove(&ip);
            } else {
                self.by_len.insert((q.len(), ip));
                self.order.push_back(ip);
            }
            return Some((ip, mad));
        }
        None
    }

    fn is_empty(&self) -> bool {
        self.total == 0
    }
}

/// Side-channel counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideStats {
    /// Frames fully written to a socket.
    pub sent: u64,
    /// Frames received and queued for the CM.
    pub received: u64,
    /// Frames dropped before sending (queue full, too old, too many peers).
    pub tx_dropped: u64,
    /// Frames dropped after receipt because the receive queue was full and their sender's
    /// queue was already among the longest ([`RxDrop::QueueFull`]).
    pub rx_dropped: u64,
    /// Frames dropped after receipt because their sender already had [`RX_PER_PEER_MAX`]
    /// MADs queued ([`RxDrop::PeerQueueFull`]).
    pub rx_peer_full: u64,
    /// Queued MADs dropped from the longest sender queue to make room for a sender with a
    /// shorter one.
    pub rx_pushed_out: u64,
    /// Connections closed for a malformed frame (bad magic or version).
    pub malformed: u64,
    /// Connections closed for a frame naming a sender other than the TCP peer
    /// ([`FrameError::SenderMismatch`]).
    pub spoofed: u64,
    /// Incoming connections closed for not completing a frame within [`FRAME_DEADLINE`].
    pub frame_timeouts: u64,
    /// Incoming connections closed to make room for a new one ([`MAX_IN_PER_IP`],
    /// [`MAX_IN_CONNS`]).
    pub evicted: u64,
    /// Frames whose GID stayed indexed to another live address ([`Learned`]); they are
    /// delivered, and learned under their own address.
    pub gid_conflicts: u64,
    /// Frames dropped because the learned-address table was full of live entries
    /// ([`LearnError::Full`]).
    pub learned_full: u64,
    /// Outgoing connections established.
    pub connects: u64,
    /// Outgoing connections that failed or broke.
    pub connect_failures: u64,
    /// Incoming connections refused because their source port was not privileged
    /// ([`PortPolicy::require_privileged`]).
    pub refused_unprivileged: u64,
    /// Outgoing connections made from an unprivileged port although
    /// [`PortPolicy::use_privileged`] asked for a reserved one (no permission to bind it).
    pub unprivileged_connects: u64,
}

/// o2iblnd's `use_privileged_port` / `require_privileged_port` on the side channel, where the
/// operating system enforces them: only a privileged process can bind a TCP port below 1024.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// Connect from a reserved port (1023 down to 512), as the kernel's rdma_cm does for
    /// o2iblnd; without the permission to bind one, connect from an ordinary port.
    pub use_privileged: bool,
    /// Refuse connections whose source port is 1024 or above.
    pub require_privileged: bool,
}

/// Ports below this need privilege to bind (`PROT_SOCK`).
const PROT_SOCK: u16 = 1024;
/// The lowest reserved port tried for outgoing connections (as the kernel's rdma_cm).
const RESERVED_MIN: u16 = 512;

/// What `progress` saw besides the sockets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// The fd given to [`SideChannel::register_extra`] became readable.
    pub extra: bool,
}

#[derive(Clone, Copy)]
enum Dir {
    /// Send-only connection to a peer.
    Out { ip: Ipv4Addr, connected: bool },
    /// Receive-only connection from a peer.
    In {
        /// The TCP peer's address.
        ip: Ipv4Addr,
        /// Accept order (lower is older): what eviction goes by.
        seq: u64,
        /// When the frame under way must be complete; `None` between frames.
        deadline: Option<Instant>,
    },
}

struct Conn {
    stream: TcpStream,
    dir: Dir,
    rx: Box<[u8; FRAME_LEN]>,
    rx_len: usize,
    last_io: Instant,
    /// Already in `SideChannel::rx_pending`.
    pending: bool,
}

struct Peer {
    conn: Option<usize>,
    queue: VecDeque<(Instant, Box<[u8; FRAME_LEN]>)>,
    /// Bytes of the front frame already written on the current connection.
    front_sent: usize,
    retry_at: Option<Instant>,
    backoff: Duration,
    last_used: Instant,
    /// Already in `SideChannel::dirty`.
    dirty: bool,
}

/// The incoming-connection limits (the constants, except in tests).
#[derive(Clone, Copy, Debug)]
struct Limits {
    in_conns: usize,
    in_per_ip: usize,
    read_budget: usize,
}

/// The TCP MAD transport (see the module docs).
pub struct SideChannel {
    poll: Poll,
    events: Events,
    listener: TcpListener,
    local: FrameHeader,
    peer_port: u16,
    conns: Slab<Conn>,
    peers: HashMap<Ipv4Addr, Peer>,
    rx: RxQueue,
    dirty: VecDeque<Ipv4Addr>,
    learned: Arc<Mutex<Learned>>,
    /// Incoming connections per source address, oldest first.
    in_by_ip: HashMap<Ipv4Addr, Vec<usize>>,
    /// Incoming connections (the lengths in `in_by_ip` summed).
    incoming: usize,
    accept_seq: u64,
    /// Incoming connections that used up their read budget with bytes possibly left.
    rx_pending: VecDeque<usize>,
    limits: Limits,
    now: Instant,
    next_sweep: Instant,
    stats: SideStats,
    policy: PortPolicy,
}

impl std::fmt::Debug for SideChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SideChannel")
            .field("listen", &self.listener.local_addr().ok())
            .field("peer_port", &self.peer_port)
            .field("conns", &self.conns.len())
            .field("peers", &self.peers.len())
            .finish()
    }
}

fn token_of(key: usize) -> Token {
    Token(key + FIRST_CONN)
}

impl SideChannel {
    /// Listens on `listen` and connects to peers on `peer_port`; every frame sent carries
    /// `local`, and outgoing connections are made from `local.ip` unless it is `0.0.0.0`.
    /// Addresses learned from received frames go into `learned`.
    pub fn bind(
        listen: SocketAddr,
        peer_port: u16,
        local: FrameHeader,
        learned: Arc<Mutex<Learned>>,
    ) -> io::Result<SideChannel> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::bind(listen)?;
        poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(SideChannel {
            poll,
            events: Events::with_capacity(EVENTS_CAPACITY),
            listener,
            local,
            peer_port,
            conns: Slab::new(),
            peers: HashMap::new(),
            rx: RxQueue::new(RX_PER_PEER_MAX, RX_QUEUE_MAX),
            dirty: VecDeque::new(),
            learned,
            in_by_ip: HashMap::new(),
            incoming: 0,
            accept_seq: 0,
            rx_pending: VecDeque::new(),
            limits: Limits { in_conns: MAX_IN_CONNS, in_per_ip: MAX_IN_PER_IP, read_budget: READ_BUDGET },
            now: Instant::ZERO,
            next_sweep: Instant::ZERO,
            stats: SideStats::default(),
            policy: PortPolicy::default(),
        })
    }

    /// Sets the privileged-port policy (default: neither).
    pub fn set_port_policy(&mut self, policy: PortPolicy) {
        self.policy = policy;
    }

    /// The listening address (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The one fd to wait on: readable when `progress` has work.
    pub fn fd(&self) -> RawFd {
        self.poll.as_raw_fd()
    }

    /// Adds `fd` to the internal poll (edge-triggered, readable); `progress` reports it in
    /// [`Readiness::extra`]. The caller keeps `fd` open for the channel's lifetime and must
    /// drain it whenever it is reported.
    pub fn register_extra(&self, fd: RawFd) -> io::Result<()> {
        self.poll.registry().register(&mut SourceFd(&fd), EXTRA, Interest::READABLE)
    }

    /// Updates the sender fields of future frames (after a LID change).
    pub fn set_local(&mut self, local: FrameHeader) {
        self.local = local;
    }

    /// Counters.
    pub fn stats(&self) -> SideStats {
        self.stats
    }

    /// Queues `mad` for `ip`; it is sent by `progress`. Frames that cannot be queued are
    /// dropped and counted, as a datagram would be.
    pub fn send(&mut self, ip: Ipv4Addr, mad: &Mad) {
        let now = self.now;
        if !self.peers.contains_key(&ip) && self.peers.len() >= MAX_PEERS {
            self.stats.tx_dropped += 1;
            return;
        }
        let peer = self.peers.entry(ip).or_insert_with(|| Peer {
            conn: None,
            queue: VecDeque::new(),
            front_sent: 0,
            retry_at: None,
            backoff: BACKOFF_MIN,
            last_used: now,
            dirty: false,
        });
        if peer.queue.len() >= PEER_QUEUE_MAX {
            self.stats.tx_dropped += 1;
            return;
        }
        peer.last_used = now;
        peer.queue.push_back((now, Box::new(encode_frame(&self.local, mad))));
        if !peer.dirty {
            peer.dirty = true;
            self.dirty.push_back(ip);
        }
    }

    /// The next received MAD with its sender's address. Senders take turns (module docs,
    /// "Hostile peers"); one sender's MADs come in order.
    pub fn recv(&mut self) -> Option<(Ipv4Addr, Mad)> {
        self.rx.pop()
    }

    /// Whether received MADs are waiting.
    pub fn has_rx(&self) -> bool {
        !self.rx.is_empty()
    }

    /// When `progress` must run again even if the fd stays quiet: now if sends are queued or
    /// a connection has unread frames beyond its read budget, else the earliest reconnect or
    /// the next sweep (idle connections, frame deadlines; only while connections exist).
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.dirty.is_empty() || !self.rx_pending.is_empty() {
            return Some(Instant::ZERO);
        }
        let retry = self.peers.values().filter_map(|p| p.retry_at).min();
        let sweep = (!self.conns.is_empty()).then_some(self.next_sweep);
        Instant::min_deadline(retry, sweep)
    }

    /// Accepts, reads, connects and writes whatever is ready at `now`. Never blocks. Errors
    /// of single connections are handled here (the connection is closed); only a failing
    /// `epoll_wait` is returned.
    pub fn progress(&mut self, now: Instant) -> io::Result<Readiness> {
        self.now = now;
        let mut ready = Readiness::default();
        let pending: Vec<usize> = self.rx_pending.drain(..).collect();
        for &key in &pending {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.pending = false;
            }
        }
        loop {
            match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Still owed a budget: keep them for the next call.
                    for &key in &pending {
                        if let Some(conn) = self.conns.get_mut(key) {
                            if !conn.pending {
                                conn.pending = true;
                                self.rx_pending.push_back(key);
                            }
                        }
                    }
                    return Err(e);
                }
            }
            let tokens: Vec<(Token, bool)> =
                self.events.iter().map(|e| (e.token(), e.is_writable())).collect();
            for &(token, writable) in &tokens {
                match token {
                    LISTENER => self.accept_all(),
                    EXTRA => ready.extra = true,
                    Token(t) => self.on_conn_event(t - FIRST_CONN, writable),
                }
            }
            if tokens.len() < EVENTS_CAPACITY {
                break;
            }
        }
        // Connections that used up their budget in an earlier call get one more budget now,
        // unless an event of this call already gave them one and they used it up again.
        for key in pending {
            if self.conns.get(key).is_some_and(|c| !c.pending) {
                self.read_in(key);
            }
        }
        let due: Vec<Ipv4Addr> = self
            .peers
            .iter()
            .filter(|(_, p)| p.retry_at.is_some_and(|t| t <= now))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in due {
            if let Some(p) = self.peers.get_mut(&ip) {
                p.retry_at = None;
                if !p.dirty {
                    p.dirty = true;
                    self.dirty.push_back(ip);
                }
            }
        }
        while let Some(ip) = self.dirty.pop_front() {
            self.flush(ip);
        }
        if now >= self.next_sweep {
            self.next_sweep = now + SWEEP_EVERY;
            self.sweep();
        }
        Ok(ready)
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    // The listener is IPv4; a mapped address is the same peer.
                    let ip = match peer {
                        SocketAddr::V4(a) => *a.ip(),
                        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
                            Some(ip) => ip,
                            None => continue, // dropping the stream closes it
                        },
                    };
                    if self.policy.require_privileged && peer.port() >= PROT_SOCK {
                        self.stats.refused_unprivileged += 1;
                        continue;
                    }
                    self.make_room(ip);
                    let _ = stream.set_nodelay(true);
                    let entry = self.conns.vacant_entry();
                    let key = entry.key();
                    if self.poll.registry().register(&mut stream, token_of(key), Interest::READABLE).is_err()
                    {
                        continue;
                    }
                    self.accept_seq += 1;
                    entry.insert(Conn {
                        stream,
                        dir: Dir::In { ip, seq: self.accept_seq, deadline: Some(self.now + FRAME_DEADLINE) },
                        rx: Box::new([0u8; FRAME_LEN]),
                        rx_len: 0,
                        last_io: self.now,
                        pending: false,
                    });
                    self.in_by_ip.entry(ip).or_default().push(key);
                    self.incoming += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock ends the burst; anything else (EMFILE...) leaves the connection in
                // the backlog for the next readiness edge.
                Err(_) => break,
            }
        }
    }

    /// Frees a slot for a new connection from `ip` if the limits need one (module docs,
    /// "Slots"): `ip`'s oldest connection when it has its share, else the oldest of all when
    /// every slot is taken.
    fn make_room(&mut self, ip: Ipv4Addr) {
        let victim = match self.in_by_ip.get(&ip) {
            Some(keys) if keys.len() >= self.limits.in_per_ip => keys.first().copied(),
            _ if self.incoming >= self.limits.in_conns => self
                .conns
                .iter()
                .filter_map(|(k, c)| match c.dir {
                    Dir::In { seq, .. } => Some((seq, k)),
                    Dir::Out { .. } => None,
                })
                .min()
                .map(|(_, k)| k),
            _ => None,
        };
        if let Some(key) = victim {
            self.stats.evicted += 1;
            self.close(key);
        }
    }

    fn on_conn_event(&mut self, key: usize, writable: bool) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        match conn.dir {
            Dir::In { .. } => self.read_in(key),
            Dir::Out { ip, connected } => {
                if !connected {
                    match conn.stream.take_error() {
                        Ok(None) => {}
                        Ok(Some(_)) | Err(_) => return self.fail_out(key),
                    }
                    match conn.stream.peer_addr() {
                        Ok(_) => {
                            conn.dir = Dir::Out { ip, connected: true };
                            conn.last_io = self.now;
                            self.stats.connects += 1;
                            if let Some(p) = self.peers.get_mut(&ip) {
                                p.backoff = BACKOFF_MIN;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => return, // still connecting
                        Err(_) => return self.fail_out(key),
                    }
                }
                // Peers never write on our outgoing connections; read only to notice EOF.
                let mut scratch = [0u8; 512];
                loop {
                    let Some(conn) = self.conns.get_mut(key) else { return };
                    match conn.stream.read(&mut scratch) {
                        Ok(0) => return self.fail_out(key),
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => return self.fail_out(key),
                    }
                }
                if writable || !self.peers.get(&ip).is_none_or(|p| p.queue.is_empty()) {
                    self.flush(ip);
                }
            }
        }
    }

    /// Reads whole frames, at most the read budget (module docs, "Connections").
    fn read_in(&mut self, key: usize) {
        let now = self.now;
        let mut frames = 0;
        loop {
            let Some(conn) = self.conns.get_mut(key) else { return };
            let Dir::In { ip, seq, deadline } = conn.dir else { return };
            if frames >= self.limits.read_budget {
                if !conn.pending {
                    conn.pending = true;
                    self.rx_pending.push_back(key);
                }
                return;
            }
            // `rx_len < FRAME_LEN` always holds here, so the buffer is never empty.
            let buf = conn.rx.get_mut(conn.rx_len..).unwrap_or_default();
            match conn.stream.read(buf) {
                Ok(0) => return self.close(key),
                Ok(n) => {
                    conn.last_io = now;
                    // A frame's first byte starts its deadline (the first frame's runs from
                    // the accept).
                    let deadline = deadline.or(Some(now + FRAME_DEADLINE));
                    conn.rx_len = conn.rx_len.saturating_add(n).min(FRAME_LEN);
                    if conn.rx_len < FRAME_LEN {
                        conn.dir = Dir::In { ip, seq, deadline };
                        continue;
                    }
                    conn.rx_len = 0;
                    conn.dir = Dir::In { ip, seq, deadline: None };
                    frames += 1;
                    let frame = decode_frame(&conn.rx)
                        .and_then(|(h, mad)| frame_sender(&h, ip).map(|from| (from, h, mad)));
                    match frame {
                        Ok((from, h, mad)) => self.deliver(from, h, mad),
                        Err(e) => {
                            match e {
                                FrameError::BadMagic | FrameError::BadVersion(_) => self.stats.malformed += 1,
                                FrameError::SenderMismatch { .. } => self.stats.spoofed += 1,
                            }
                            return self.close(key);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.close(key),
            }
        }
    }

    /// Learns the sender's address and queues the MAD (`ip` is checked: [`frame_sender`]).
    fn deliver(&mut self, ip: Ipv4Addr, h: FrameHeader, mad: Mad) {
        let learnt = {
            let mut learned = self.learned.lock().unwrap_or_else(|p| p.into_inner());
            learned.learn(ip, PortAddr { gid: h.gid, lid: h.lid }, self.now)
        };
        match learnt {
            Ok(None) => {}
            Ok(Some(_holder)) => self.stats.gid_conflicts += 1,
            Err(LearnError::Full) => {
                self.stats.learned_full += 1;
                return;
            }
        }
        match self.rx.push(ip, mad) {
            Ok(pushed_out) => {
                self.stats.received += 1;
                if pushed_out.is_some() {
                    self.stats.rx_pushed_out += 1;
                }
            }
            Err(RxDrop::PeerQueueFull) => self.stats.rx_peer_full += 1,
            Err(RxDrop::QueueFull) => self.stats.rx_dropped += 1,
        }
    }

    /// Sends what `ip` has queued, connecting first if needed.
    fn flush(&mut self, ip: Ipv4Addr) {
        let now = self.now;
        let Some(peer) = self.peers.get_mut(&ip) else { return };
        peer.dirty = false;
        if peer.front_sent == 0 {
            while peer.queue.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > FRAME_TTL) {
                peer.queue.pop_front();
                self.stats.tx_dropped += 1;
            }
        }
        if peer.queue.is_empty() {
            return;
        }
        let key = match peer.conn {
            Some(k) => k,
            None => {
                if peer.retry_at.is_some_and(|t| t > now) {
                    return;
                }
                peer.retry_at = None;
                let addr = SocketAddrV4::new(ip, self.peer_port);
                // From the address our frames name, so that the peer's sender check passes on
                // a host with several (module docs, "Hostile peers").
                let from = self.local.ip;
                let connected = if self.policy.use_privileged {
                    match connect_from_reserved(from, addr) {
                        Ok(Some(s)) => Ok(s),
                        Ok(None) => {
                            self.stats.unprivileged_connects += 1;
                            connect_bound(SocketAddrV4::new(from, 0), addr).map_err(ConnectError::into_io)
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    connect_bound(SocketAddrV4::new(from, 0), addr).map_err(ConnectError::into_io)
                };
                let mut stream = match connected {
                    Ok(s) => s,
                    Err(_) => {
                        self.stats.connect_failures += 1;
                        peer.retry_at = Some(now + peer.backoff);
                        peer.backoff = (peer.backoff * 2).min(BACKOFF_MAX);
                        return;
                    }
                };
                let _ = stream.set_nodelay(true);
                let entry = self.conns.vacant_entry();
                let k = entry.key();
                let interest = Interest::READABLE | Interest::WRITABLE;
                if self.poll.registry().register(&mut stream, token_of(k), interest).is_err() {
                    self.stats.connect_failures += 1;
                    peer.retry_at = Some(now + peer.backoff);
                    peer.backoff = (peer.backoff * 2).min(BACKOFF_MAX);
                    return;
                }
                entry.insert(Conn {
                    stream,
                    dir: Dir::Out { ip, connected: false },
                    rx: Box::new([0u8; FRAME_LEN]),
                    rx_len: 0,
                    last_io: now,
                    pending: false,
                });
                peer.conn = Some(k);
                peer.front_sent = 0;
                return; // the writable edge says when the connect finished
            }
        };
        let Some(conn) = self.conns.get_mut(key) else {
            peer.conn = None;
            return;
        };
        if !matches!(conn.dir, Dir::Out { connected: true, .. }) {
            return;
        }
        let mut failed = false;
        while let Some((_, frame)) = peer.queue.front() {
            let rest = frame.get(peer.front_sent..).unwrap_or_default();
            match conn.stream.write(rest) {
                Ok(0) => {
                    failed = true;
                    break;
                }
                Ok(n) => {
                    conn.last_io = now;
                    peer.front_sent += n;
                    if peer.front_sent >= FRAME_LEN {
                        peer.queue.pop_front();
                        peer.front_sent = 0;
                        self.stats.sent += 1;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            self.fail_out(key);
        }
    }

    /// An outgoing connection failed or broke: close it and, if frames wait, retry later.
    /// A partly written frame is sent again from its start on the next connection.
    fn fail_out(&mut self, key: usize) {
        let ip = match self.conns.get(key).map(|c| &c.dir) {
            Some(Dir::Out { ip, .. }) => *ip,
            _ => return self.close(key),
        };
        self.close(key);
        self.stats.connect_failures += 1;
        let now = self.now;
        if let Some(p) = self.peers.get_mut(&ip) {
            if p.conn == Some(key) {
                p.conn = None;
            }
            p.front_sent = 0;
            if !p.queue.is_empty() {
                p.retry_at = Some(now + p.backoff);
                p.backoff = (p.backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    fn close(&mut self, key: usize) {
        if let Some(mut conn) = self.conns.try_remove(key) {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            match conn.dir {
                Dir::Out { ip, .. } => {
                    if let Some(p) = self.peers.get_mut(&ip) {
                        if p.conn == Some(key) {
                            p.conn = None;
                            p.front_sent = 0;
                        }
                    }
                }
                Dir::In { ip, .. } => {
                    self.incoming = self.incoming.saturating_sub(1);
                    if let Some(keys) = self.in_by_ip.get_mut(&ip) {
                        keys.retain(|&k| k != key);
                        if keys.is_empty() {
                            self.in_by_ip.remove(&ip);
                        }
                    }
                }
            }
        }
    }

    /// Reopens stalled outgoing connections, closes incoming ones past their frame deadline
    /// and idle ones, and forgets idle peers.
    fn sweep(&mut self) {
        let now = self.now;
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.dir, Dir::In { deadline: Some(d), .. } if now > d))
            .map(|(k, _)| k)
            .collect();
        for k in late {
            self.stats.frame_timeouts += 1;
            self.close(k);
        }
        let stalled: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| match c.dir {
                Dir::Out { ip, .. } => {
                    self.peers.get(&ip).is_some_and(|p| !p.queue.is_empty())
                        && now.saturating_duration_since(c.last_io) > STALL
                }
                Dir::In { .. } => false,
            })
            .map(|(k, _)| k)
            .collect();
        for k in stalled {
            self.fail_out(k);
        }
        let idle: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                let limit = match c.dir {
                    Dir::Out { ip, .. } => {
                        if self.peers.get(&ip).is_some_and(|p| !p.queue.is_empty()) {
                            return false;
                        }
                        IDLE_OUT
                    }
                    Dir::In { .. } => IDLE_IN,
                };
                now.saturating_duration_since(c.last_io) > limit
            })
            .map(|(k, _)| k)
            .collect();
        for k in idle {
            self.close(k);
        }
        self.peers.retain(|_, p| {
            p.conn.is_some()
                || !p.queue.is_empty()
                || p.retry_at.is_some()
                || now.saturating_duration_since(p.last_used) <= IDLE_OUT
        });
    }
}

/// Why [`connect_bound`] failed.
#[derive(Debug)]
enum ConnectError {
    /// `socket(2)` failed.
    Socket(io::Error),
    /// `bind(2)` failed.
    Bind(io::Error),
    /// `connect(2)` failed at once.
    Connect(io::Error),
}

impl ConnectError {
    fn into_io(self) -> io::Error {
        match self {
            ConnectError::Socket(e) | ConnectError::Bind(e) | ConnectError::Connect(e) => e,
        }
    }
}

/// A non-blocking TCP socket bound to `local`, connecting to `remote` (the connect finishes
/// in the background: the socket becomes writable). Port 0 in `local` leaves the port to the
/// connect, as an unbound socket would.
fn connect_bound(local: SocketAddrV4, remote: SocketAddrV4) -> Result<TcpStream, ConnectError> {
    // SAFETY: socket(2) takes no pointers; the result is checked before use.
    let fd = unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
    };
    if fd < 0 {
        return Err(ConnectError::Socket(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a socket we just created and own from here on; the OwnedFd closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if local.port() == 0 {
        let one: libc::c_int = 1;
        let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: passes a c_int that lives across the call, with its size. A failure (a
        // kernel before 4.2) only means the port is picked at bind rather than at connect.
        let _ = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                std::ptr::addr_of!(one).cast(),
                len,
            )
        };
    }
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let from = sockaddr_in(local);
    // SAFETY: binds our socket to a sockaddr_in that lives across the call, with its size.
    if unsafe { libc::bind(fd, std::ptr::addr_of!(from).cast(), len) } != 0 {
        return Err(ConnectError::Bind(io::Error::last_os_error()));
    }
    let to = sockaddr_in(remote);
    // SAFETY: connects our socket to a sockaddr_in that lives across the call, with its size.
    if unsafe { libc::connect(fd, std::ptr::addr_of!(to).cast(), len) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(ConnectError::Connect(e));
        }
    }
    Ok(TcpStream::from_std(std::net::TcpStream::from(owned)))
}

/// A non-blocking connection to `addr` from `ip` and the highest free reserved port (1023
/// down to 512); `Ok(None)` when this process may not bind reserved ports.
fn connect_from_reserved(ip: Ipv4Addr, addr: SocketAddrV4) -> io::Result<Option<TcpStream>> {
    for port in (RESERVED_MIN..PROT_SOCK).rev() {
        match connect_bound(SocketAddrV4::new(ip, port), addr) {
            Ok(s) => return Ok(Some(s)),
            Err(ConnectError::Bind(e)) => match e.raw_os_error() {
                Some(libc::EADDRINUSE) => continue,
                Some(libc::EACCES | libc::EPERM) => return Ok(None),
                _ => return Err(e),
            },
            // The 4-tuple is taken (a connection to the same peer from this port).
            Err(ConnectError::Connect(e))
                if matches!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL | libc::EADDRINUSE)) =>
            {
                continue;
            }
            Err(e) => return Err(e.into_io()),
        }
    }
    Err(io::Error::new(io::ErrorKind::AddrInUse, "every reserved port (512..1023) is in use"))
}

fn sockaddr_in(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::os::fd::IntoRawFd as _;

    use super::*;

    const HOST2: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

    fn header(last: u8) -> FrameHeader {
        FrameHeader {
            ip: Ipv4Addr::new(127, 0, 0, 1),
            gid: Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, last)),
            lid: 0xffff,
        }
    }

    fn mad(tag: u8) -> Mad {
        let mut m = [0u8; 256];
        m[0] = 1;
        m[1] = 7;
        m[255] = tag;
        m
    }

    fn learned() -> Arc<Mutex<Learned>> {
        Arc::new(Mutex::new(Learned::new()))
    }

    fn channel(last: u8, peer_port: u16) -> SideChannel {
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        SideChannel::bind(listen, peer_port, header(last), learned()).unwrap()
    }

    /// A frame from `ip` naming itself (GID `::ffff:ip`, LID 0xffff).
    fn frame_from(ip: Ipv4Addr, tag: u8) -> [u8; FRAME_LEN] {
        encode_frame(&FrameHeader { ip, gid: Gid::from_ipv4(ip), lid: 0xffff }, &mad(tag))
    }

    /// A blocking client socket connected (or connecting) to `to` from address `from`; its
    /// reads and writes give up after 5 s.
    fn client(from: Ipv4Addr, to: SocketAddr) -> std::net::TcpStream {
        let SocketAddr::V4(to) = to else { panic!("the listener is IPv4") };
        let s = connect_bound(SocketAddrV4::new(from, 0), to).unwrap_or_else(|e| panic!("connect: {e:?}"));
        // SAFETY: `into_raw_fd` gives up the socket's only owner; the std stream takes it over.
        let s = unsafe { std::net::TcpStream::from_raw_fd(s.into_raw_fd()) };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    /// Runs `b` at the fixed time `now` until `done` holds (bounded: 250 rounds of at most
    /// 20 ms).
    fn settle(b: &mut SideChannel, now: Instant, mut done: impl FnMut(&mut SideChannel) -> bool) -> bool {
        for _ in 0..250 {
            b.progress(now).unwrap();
            if done(b) {
                return true;
            }
            wait(&[b.fd()], 20);
        }
        false
    }

    /// Waits (up to `ms`) for any of `fds` to be readable, without consuming anything.
    fn wait(fds: &[RawFd], ms: i32) {
        let mut p: Vec<libc::pollfd> =
            fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
        // SAFETY: `p` is a live array of `p.len()` pollfd structs for the duration of the call.
        unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    }

    /// Runs both channels until `done` holds (bounded: `rounds` rounds of at most 20 ms).
    fn pump(
        a: &mut SideChannel,
        b: &mut SideChannel,
        now: &mut Instant,
        rounds: usize,
        mut done: impl FnMut(&mut SideChannel, &mut SideChannel) -> bool,
    ) -> bool {
        for _ in 0..rounds {
            *now += Duration::from_millis(1);
            a.progress(*now).unwrap();
            b.progress(*now).unwrap();
            if done(a, b) {
                return true;
            }
            wait(&[a.fd(), b.fd()], 20);
        }
        false
    }

    #[test]
    fn require_privileged_port_refuses_ordinary_ports_and_use_privileged_binds_a_reserved_one() {
        let mut strict = channel(1, 0);
        strict.set_port_policy(PortPolicy { use_privileged: false, require_privileged: true });
        let port = strict.local_addr().unwrap().port();
        let mut now = Instant::from_secs(1);
        let mut ordinary = channel(2, port);
        ordinary.send(Ipv4Addr::LOCALHOST, &mad(1));
        assert!(pump(&mut strict, &mut ordinary, &mut now, 200, |s, _| s.stats().refused_unprivileged > 0));
        assert!(strict.recv().is_none(), "nothing from an unprivileged port gets through");
        // SAFETY: geteuid(2) takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping the reserved-port half: not root, cannot bind ports below 1024");
            return;
        }
        let mut privileged = channel(3, port);
        privileged.set_port_policy(PortPolicy { use_privileged: true, require_privileged: false });
        privileged.send(Ipv4Addr::LOCALHOST, &mad(2));
        assert!(pump(&mut strict, &mut privileged, &mut now, 200, |s, _| s
            .recv()
            .is_some_and(|(_, m)| m[255] == 2)));
        assert_eq!(privileged.stats().unprivileged_connects, 0);
    }

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let h = FrameHeader { ip: Ipv4Addr::new(192, 168, 1, 2), gid: Gid([7; 16]), lid: 0x1234 };
        let f = encode_frame(&h, &mad(9));
        assert_eq!(&f[..4], b"LNDM");
        assert_eq!(f[4], 1);
        assert_eq!(&f[6..8], &[0x12, 0x34]);
        assert_eq!(&f[8..12], &[192, 168, 1, 2]);
        assert_eq!(decode_frame(&f), Ok((h, mad(9))));
        let mut bad = f;
        bad[0] = b'X';
        assert_eq!(decode_frame(&bad), Err(FrameError::BadMagic));
        let mut bad = f;
        bad[4] = 2;
        assert_eq!(decode_frame(&bad), Err(FrameError::BadVersion(2)));
    }

    #[test]
    fn mads_cross_loopback_both_ways_and_addresses_are_learned() {
        let mut a = channel(1, 0);
        let mut b = channel(2, a.local_addr().unwrap().port());
        a.peer_port = b.local_addr().unwrap().port();
        let mut now = Instant::from_secs(1);
        for i in 0..5 {
            a.send(Ipv4Addr::LOCALHOST, &mad(i));
        }
        assert_eq!(a.next_deadline(), Some(Instant::ZERO), "queued sends are due now");
        let mut got = Vec::new();
        assert!(pump(&mut a, &mut b, &mut now, 200, |_, b| {
            while let Some((ip, m)) = b.recv() {
                assert_eq!(ip, Ipv4Addr::LOCALHOST);
                got.push(m[255]);
            }
            got.len() == 5
        }));
        assert_eq!(got, vec![0, 1, 2, 3, 4], "one connection keeps order");
        let learned = b.learned.lock().unwrap().get(&Ipv4Addr::LOCALHOST);
        assert_eq!(learned, Some(PortAddr { gid: header(1).gid, lid: 0xffff }));

        b.send(Ipv4Addr::LOCALHOST, &mad(42));
        assert!(pump(&mut a, &mut b, &mut now, 200, |a, _| a.recv().is_some_and(|(_, m)| m[255] == 42)));
        assert_eq!(a.stats().sent, 5);
        assert_eq!(b.stats().received, 5);
        assert_eq!((a.stats().connects, b.stats().connects), (1, 1));
    }

    #[test]
    fn partial_frames_are_reassembled_and_garbage_closes_the_connection() {
        let mut b = channel(2, 1);
        let addr = b.local_addr().unwrap();
        let mut raw = std::net::TcpStream::connect(addr).unwrap();
        let f = encode_frame(&FrameHeader { ip: Ipv4Addr::UNSPECIFIED, ..header(5) }, &mad(3));
        let mut now = Instant::from_secs(1);
        for chunk in f.chunks(50) {
            raw.write_all(chunk).unwrap();
            raw.flush().unwrap();
            wait(&[b.fd()], 20);
            now += Duration::from_millis(1);
            b.progress(now).unwrap();
        }
        let mut got = None;
        for _ in 0..100 {
            if let Some(x) = b.recv() {
                got = Some(x);
                break;
            }
            wait(&[b.fd()], 20);
            now += Duration::from_millis(1);
            b.progress(now).unwrap();
        }
        let (ip, m) = got.expect("frame reassembled");
        assert_eq!(ip, Ipv4Addr::LOCALHOST, "unspecified sender address: the TCP peer's is used");
        assert_eq!(m, mad(3));

        raw.write_all(&[0u8; FRAME_LEN]).unwrap();
        for _ in 0..100 {
            wait(&[b.fd()], 20);
            now += Duration::from_millis(1);
            b.progress(now).unwrap();
            if b.stats().malformed == 1 {
                break;
            }
        }
        assert_eq!(b.stats().malformed, 1);
        assert_eq!(b.conns.len(), 0, "the connection was closed");
    }

    #[test]
    fn a_lost_peer_is_reconnected_after_a_backoff() {
        // A port with nobody listening: bind, learn the port, close.
        let port =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port();
        let mut a = channel(1, port);
        let mut now = Instant::from_secs(1);
        a.send(Ipv4Addr::LOCALHOST, &mad(1));
        for _ in 0..100 {
            a.progress(now).unwrap();
            if a.peers.get(&Ipv4Addr::LOCALHOST).is_some_and(|p| p.retry_at.is_some()) {
                break;
            }
            wait(&[a.fd()], 20);
        }
        let retry = a.peers[&Ipv4Addr::LOCALHOST].retry_at.expect("refused connect schedules a retry");
        assert!(retry > now && a.next_deadline() == Some(retry));
        assert!(a.stats().connect_failures >= 1);

        // The peer comes up on that port; nothing happens before the retry time.
        let mut b = SideChannel::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), 1, header(2), learned())
            .unwrap();
        a.progress(now).unwrap();
        assert!(a.peers[&Ipv4Addr::LOCALHOST].conn.is_none());
        now = retry;
        assert!(pump(&mut a, &mut b, &mut now, 200, |_, b| b.recv().is_some_and(|(_, m)| m[255] == 1)));
        assert_eq!(a.stats().sent, 1);

        // The peer restarts: the old connection breaks, the next send reconnects.
        drop(b);
        let mut b = SideChannel::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), 1, header(2), learned())
            .unwrap();
        let mut delivered = false;
        for round in 0..50u8 {
            a.send(Ipv4Addr::LOCALHOST, &mad(100 + round));
            let ok = pump(&mut a, &mut b, &mut now, 25, |_, b| b.recv().is_some());
            now += Duration::from_secs(6); // past any backoff
            if ok {
                delivered = true;
                break;
            }
        }
        assert!(delivered, "sends resume after the peer restarts");
        assert!(a.stats().connects >= 2);
    }

    #[test]
    fn queues_are_bounded_and_old_frames_expire() {
        let port =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port();
        let mut a = channel(1, port);
        let now = Instant::from_secs(1);
        a.progress(now).unwrap();
        for i in 0..PEER_QUEUE_MAX + 10 {
            a.send(Ipv4Addr::LOCALHOST, &mad(i as u8));
        }
        assert_eq!(a.stats().tx_dropped, 10);
        assert_eq!(a.peers[&Ipv4Addr::LOCALHOST].queue.len(), PEER_QUEUE_MAX);
        // Eleven seconds later, nothing was delivered: everything expires at the next flush.
        let later = now + Duration::from_secs(11);
        a.progress(later).unwrap();
        assert_eq!(a.peers[&Ipv4Addr::LOCALHOST].queue.len(), 0);
        assert_eq!(a.stats().tx_dropped, 10 + PEER_QUEUE_MAX as u64);
    }

    #[test]
    fn the_extra_fd_is_reported() {
        let mut a = channel(1, 1);
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) }, 0);
        a.register_extra(fds[0]).unwrap();
        assert_eq!(a.progress(Instant::ZERO).unwrap(), Readiness { extra: false });
        // SAFETY: writes one byte from a live buffer to the pipe we just created.
        assert_eq!(unsafe { libc::write(fds[1], [1u8].as_ptr().cast(), 1) }, 1);
        wait(&[a.fd()], 1000);
        assert_eq!(a.progress(Instant::ZERO).unwrap(), Readiness { extra: true });
        drop(a);
        for fd in fds {
            // SAFETY: closes the pipe ends this test owns, once.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn the_sender_is_the_tcp_peer_or_no_one() {
        let named = |ip| FrameHeader { ip, ..header(1) };
        assert_eq!(frame_sender(&named(HOST2), HOST2), Ok(HOST2));
        assert_eq!(frame_sender(&named(Ipv4Addr::UNSPECIFIED), HOST2), Ok(HOST2));
        assert_eq!(
            frame_sender(&named(Ipv4Addr::LOCALHOST), HOST2),
            Err(FrameError::SenderMismatch { claimed: Ipv4Addr::LOCALHOST, peer: HOST2 })
        );
    }

    #[test]
    fn a_frame_naming_another_sender_is_dropped_and_teaches_nothing() {
        let mut b = channel(2, 1);
        let addr = b.local_addr().unwrap();
        let now = Instant::from_secs(1);
        let real = PortAddr { gid: Gid([2; 16]), lid: 2 };
        assert_eq!(b.learned.lock().unwrap().learn(HOST2, real, now), Ok(None));

        // From 127.0.0.1, posing as 127.0.0.2 with another GID and LID.
        let mut liar = client(Ipv4Addr::LOCALHOST, addr);
        let pose = FrameHeader { ip: HOST2, gid: Gid([9; 16]), lid: 9 };
        liar.write_all(&encode_frame(&pose, &mad(1))).unwrap();
        assert!(settle(&mut b, now, |b| b.stats().spoofed == 1));
        assert!(b.recv().is_none(), "the frame was dropped");
        assert_eq!(b.stats().received, 0);
        assert_eq!(b.incoming, 0, "the connection was closed");
        assert_eq!(liar.read(&mut [0u8; 1]).unwrap(), 0, "the liar sees EOF");
        let learned = b.learned.lock().unwrap();
        assert_eq!(learned.get(&HOST2), Some(real), "what 127.0.0.2 taught stays");
        assert_eq!(learned.get(&Ipv4Addr::LOCALHOST), None);
        assert_eq!(learned.ip_of_gid(&Gid([9; 16])), None);
        drop(learned);

        // The same host naming itself gets through.
        let mut honest = client(Ipv4Addr::LOCALHOST, addr);
        honest.write_all(&frame_from(Ipv4Addr::LOCALHOST, 2)).unwrap();
        let mut got = None;
        assert!(settle(&mut b, now, |b| {
            got = b.recv();
            got.is_some()
        }));
        assert_eq!(got, Some((Ipv4Addr::LOCALHOST, mad(2))));
        assert_eq!(b.stats().spoofed, 1);
    }

    #[test]
    fn outgoing_connections_leave_from_the_address_our_frames_name() {
        // `a` is 127.0.0.2 (its frames say so) on a host that also has 127.0.0.1, the address
        // the kernel would pick to reach 127.0.0.1: the sender check at `b` needs the bind.
        let mut b = channel(1, 1);
        let mut a = SideChannel::bind(
            SocketAddr::from((HOST2, 0)),
            b.local_addr().unwrap().port(),
            FrameHeader { ip: HOST2, ..header(2) },
            learned(),
        )
        .unwrap();
        let mut now = Instant::from_secs(1);
        a.send(Ipv4Addr::LOCALHOST, &mad(7));
        let mut got = None;
        assert!(pump(&mut a, &mut b, &mut now, 200, |_, b| {
            got = b.recv();
            got.is_some() || b.stats().spoofed > 0
        }));
        assert_eq!(got, Some((HOST2, mad(7))));
        assert_eq!(b.stats().spoofed, 0);
    }

    #[test]
    fn a_learned_gid_stays_indexed_to_its_live_holder() {
        let mut l = Learned::new();
        let t = Instant::from_secs(10);
        let gid = Gid([7; 16]);
        let one = Ipv4Addr::new(10, 0, 0, 1);
        let two = Ipv4Addr::new(10, 0, 0, 2);
        assert_eq!(l.learn(one, PortAddr { gid, lid: 1 }, t), Ok(None));
        // Another address claiming the GID is learned under its own name only.
        assert_eq!(l.learn(two, PortAddr { gid, lid: 2 }, t), Ok(Some(one)));
        assert_eq!(l.ip_of_gid(&gid), Some(one));
        assert_eq!(l.get(&one), Some(PortAddr { gid, lid: 1 }));
        assert_eq!(l.get(&two), Some(PortAddr { gid, lid: 2 }));
        // The holder's own frames keep it live...
        let later = t + LEARNED_HOLD;
        assert_eq!(l.learn(one, PortAddr { gid, lid: 1 }, later), Ok(None));
        assert_eq!(l.learn(two, PortAddr { gid, lid: 2 }, later + Duration::from_secs(1)), Ok(Some(one)));
        // ...and once it falls silent for LEARNED_HOLD the index moves.
        let silent = later + LEARNED_HOLD + Duration::from_secs(1);
        assert_eq!(l.learn(two, PortAddr { gid, lid: 2 }, silent), Ok(None));
        assert_eq!(l.ip_of_gid(&gid), Some(two));
        // An address changing its own GID frees the old one.
        let other = Gid([8; 16]);
        assert_eq!(l.learn(two, PortAddr { gid: other, lid: 2 }, silent), Ok(None));
        assert_eq!(l.ip_of_gid(&gid), None);
        assert_eq!(l.ip_of_gid(&other), Some(two));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn the_learned_table_makes_room_only_from_entries_no_longer_live() {
        let mut l = Learned::with_max(3);
        let t = Instant::from_secs(10);
        let ip = |i: u8| Ipv4Addr::new(10, 0, 0, i);
        let addr = |i: u8| PortAddr { gid: Gid([i; 16]), lid: u16::from(i) };
        for i in 1..=3 {
            assert_eq!(l.learn(ip(i), addr(i), t + Duration::from_secs(u64::from(i))), Ok(None));
        }
        // Full of live entries: a new address is refused, known ones still update.
        let soon = t + Duration::from_secs(4);
        assert_eq!(l.learn(ip(4), addr(4), soon), Err(LearnError::Full));
        assert_eq!(l.learn(ip(2), addr(2), soon), Ok(None));
        assert_eq!(l.len(), 3);
        // Once the least recently heard (10.0.0.1) is no longer live, a new address takes its
        // place; 10.0.0.3 is still live, so the next one is refused again.
        let late = t + Duration::from_secs(1) + LEARNED_HOLD + Duration::from_secs(1);
        assert_eq!(l.learn(ip(4), addr(4), late), Ok(None));
        assert_eq!(l.get(&ip(1)), None);
        assert_eq!(l.ip_of_gid(&addr(1).gid), None);
        assert_eq!(l.get(&ip(4)), Some(addr(4)));
        assert_eq!(l.learn(ip(5), addr(5), late), Err(LearnError::Full));
        assert_eq!(l.len(), 3);
    }

    #[test]
    fn a_connection_that_does_not_complete_a_frame_in_time_is_closed() {
        let mut b = channel(2, 1);
        let addr = b.local_addr().unwrap();
        let t0 = Instant::from_secs(1);
        let mut partial = client(Ipv4Addr::LOCALHOST, addr);
        partial.write_all(&frame_from(Ipv4Addr::LOCALHOST, 1)[..100]).unwrap();
        let mut silent = client(Ipv4Addr::LOCALHOST, addr);
        let mut whole = client(Ipv4Addr::LOCALHOST, addr);
        whole.write_all(&frame_from(Ipv4Addr::LOCALHOST, 2)).unwrap();
        assert!(settle(&mut b, t0, |b| b.incoming == 3
            && b.stats().received == 1
            && b.conns.iter().any(|(_, c)| c.rx_len == 100)));

        b.progress(t0 + FRAME_DEADLINE - Duration::from_secs(1)).unwrap();
        assert_eq!((b.incoming, b.stats().frame_timeouts), (3, 0));
        // Past the deadline: the partial frame and the connection that never sent one go.
        b.progress(t0 + FRAME_DEADLINE + Duration::from_secs(1)).unwrap();
        assert_eq!((b.incoming, b.stats().frame_timeouts), (1, 2));
        assert_eq!(partial.read(&mut [0u8; 1]).unwrap(), 0);
        assert_eq!(silent.read(&mut [0u8; 1]).unwrap(), 0);

        // A connection between frames may idle; the first byte of a frame starts its clock.
        let t1 = t0 + Duration::from_secs(20);
        b.progress(t1).unwrap();
        assert_eq!(b.incoming, 1);
        whole.write_all(b"L").unwrap();
        assert!(settle(&mut b, t1, |b| b.conns.iter().any(|(_, c)| c.rx_len == 1)));
        b.progress(t1 + FRAME_DEADLINE - Duration::from_secs(1)).unwrap();
        assert_eq!(b.incoming, 1);
        b.progress(t1 + FRAME_DEADLINE + Duration::from_secs(1)).unwrap();
        assert_eq!((b.incoming, b.stats().frame_timeouts), (0, 3));
        assert_eq!(whole.read(&mut [0u8; 1]).unwrap(), 0);
    }

    #[test]
    fn a_new_connection_evicts_the_oldest_instead_of_being_refused() {
        let mut b = channel(2, 1);
        b.limits.in_conns = 3;
        b.limits.in_per_ip = 2;
        let addr = b.local_addr().unwrap();
        let now = Instant::from_secs(1);
        let open = |b: &mut SideChannel, from: Ipv4Addr, n: usize| {
            let c = client(from, addr);
            assert!(settle(b, now, |b| b.accept_seq == n as u64), "connection {n} accepted");
            c
        };
        // One address at its cap: its own oldest goes.
        let mut first = open(&mut b, Ipv4Addr::LOCALHOST, 1);
        let _second = open(&mut b, Ipv4Addr::LOCALHOST, 2);
        let _third = open(&mut b, Ipv4Addr::LOCALHOST, 3);
        assert_eq!((b.incoming, b.stats().evicted), (2, 1));
        assert_eq!(first.read(&mut [0u8; 1]).unwrap(), 0, "the oldest from 127.0.0.1 was closed");
        // Every slot taken by idle connections: a newcomer still gets in, in place of the
        // oldest (the second), and its frame is delivered.
        let _fourth = open(&mut b, Ipv4Addr::new(127, 0, 0, 3), 4);
        assert_eq!((b.incoming, b.stats().evicted), (3, 1));
        let newcomer = Ipv4Addr::new(127, 0, 0, 4);
        let mut fifth = open(&mut b, newcomer, 5);
        assert_eq!((b.incoming, b.stats().evicted), (3, 2));
        assert!(
            b.in_by_ip.get(&Ipv4Addr::LOCALHOST).is_some_and(|k| k.len() == 1),
            "the second went, the third stays"
        );
        fifth.write_all(&frame_from(newcomer, 5)).unwrap();
        let mut got = None;
        assert!(settle(&mut b, now, |b| {
            got = b.recv();
            got.is_some()
        }));
        assert_eq!(got, Some((newcomer, mad(5))));
    }

    #[test]
    fn one_flooding_sender_drops_its_own_frames_not_others() {
        let mut b = channel(2, 1);
        let addr = b.local_addr().unwrap();
        let now = Instant::from_secs(1);
        let flood = 200;
        let mut flooder = client(Ipv4Addr::LOCALHOST, addr);
        let burst: Vec<u8> = (0..flood).flat_map(|i| frame_from(Ipv4Addr::LOCALHOST, i as u8)).collect();
        flooder.write_all(&burst).unwrap();
        assert!(settle(&mut b, now, |b| b.stats().received + b.stats().rx_peer_full == flood));
        assert_eq!(b.stats().received, RX_PER_PEER_MAX as u64);
        assert_eq!(b.stats().rx_peer_full, flood - RX_PER_PEER_MAX as u64);

        let mut honest = client(HOST2, addr);
        honest.write_all(&frame_from(HOST2, 99)).unwrap();
        assert!(settle(&mut b, now, |b| b.stats().received == RX_PER_PEER_MAX as u64 + 1));
        // Senders take turns: the honest MAD comes second, not after the flood.
        let first_two: Vec<(Ipv4Addr, u8)> =
            (0..2).filter_map(|_| b.recv()).map(|(ip, m)| (ip, m[255])).collect();
        assert_eq!(first_two, vec![(Ipv4Addr::LOCALHOST, 0), (HOST2, 99)]);
        let rest: Vec<u8> = std::iter::from_fn(|| b.recv()).map(|(_, m)| m[255]).collect();
        assert_eq!(rest, (1..RX_PER_PEER_MAX as u8).collect::<Vec<_>>(), "the flooder's in order");
    }

    #[test]
    fn a_full_receive_queue_pushes_out_the_longest_sender() {
        let mut q = RxQueue::new(4, 8);
        let ip = |i: u8| Ipv4Addr::new(10, 0, 0, i);
        for i in 0..4 {
            assert_eq!(q.push(ip(1), mad(i)), Ok(None));
            assert_eq!(q.push(ip(2), mad(10 + i)), Ok(None));
        }
        assert_eq!(q.push(ip(1), mad(9)), Err(RxDrop::PeerQueueFull));
        // Full: a newcomer displaces the newest MAD of a longest queue, one at a time.
        assert_eq!(q.push(ip(3), mad(20)), Ok(Some(ip(2))));
        assert_eq!(q.push(ip(3), mad(21)), Ok(Some(ip(1))));
        // Now 3, 3 and 2: nobody is longer than the newcomer would be.
        assert_eq!(q.push(ip(3), mad(22)), Err(RxDrop::QueueFull));
        let order: Vec<(u8, u8)> =
            std::iter::from_fn(|| q.pop()).map(|(a, m)| (a.octets()[3], m[255])).collect();
        assert_eq!(order, vec![(1, 0), (2, 10), (3, 20), (1, 1), (2, 11), (3, 21), (1, 2), (2, 12)]);
        assert!(q.is_empty());
        assert!(q.by_len.is_empty() && q.order.is_empty() && q.by_ip.is_empty());
    }

    #[test]
    fn a_connection_is_read_at_most_its_budget_per_progress() {
        let mut b = channel(2, 1);
        b.limits.read_budget = 4;
        let addr = b.local_addr().unwrap();
        let now = Instant::from_secs(1);
        // Ten frames wait in the socket before the channel first looks.
        let mut c = client(Ipv4Addr::LOCALHOST, addr);
        let burst: Vec<u8> = (0..10).flat_map(|i| frame_from(Ipv4Addr::LOCALHOST, i)).collect();
        c.write_all(&burst).unwrap();
        assert!(settle(&mut b, now, |b| b.stats().received > 0));
        assert_eq!(b.stats().received, 4, "one budget's worth");
        assert_eq!(b.next_deadline(), Some(Instant::ZERO), "the rest is due at once");
        b.progress(now).unwrap();
        assert_eq!(b.stats().received, 8);
        b.progress(now).unwrap();
        assert_eq!(b.stats().received, 10);
        b.progress(now).unwrap();
        assert_ne!(b.next_deadline(), Some(Instant::ZERO));
        let got: Vec<u8> = std::iter::from_fn(|| b.recv()).map(|(_, m)| m[255]).collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }
}
