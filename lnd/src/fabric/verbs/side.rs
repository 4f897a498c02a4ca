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
//! * One outgoing connection per peer IP, opened on the first send to it, send-only. A failed
//!   connect, a write error or EOF closes it; while frames are queued it is reopened after a
//!   backoff (100 ms doubling to 5 s). Frames older than 10 s are dropped instead of sent, and
//!   a peer's queue holds at most 1024 frames (more are dropped and counted): MADs are
//!   datagrams and the CM retransmits.
//! * An outgoing connection that makes no progress for 20 s while frames wait (a peer that
//!   vanished without a reset, a connect that hangs) is closed and reopened.
//! * Connections idle for 5 minutes (outgoing) or 10 minutes (incoming) are closed.
//! * Everything is driven by [`SideChannel::progress`]: sockets live in an internal
//!   `mio::Poll` whose fd ([`SideChannel::fd`]) is the one the driver waits on. Extra fds
//!   (the device's async-event fd) can share it ([`SideChannel::register_extra`]). All
//!   registrations are edge-triggered, so `progress` always drains what is readable.

use std::collections::{HashMap, VecDeque};
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
/// Received MADs kept before new ones are dropped.
pub const RX_QUEUE_MAX: usize = 4096;
/// Learned peer addresses kept (new peers beyond it are not learned).
pub const LEARNED_MAX: usize = 65_536;

const LISTENER: Token = Token(0);
const EXTRA: Token = Token(1);
const FIRST_CONN: usize = 2;
const EVENTS_CAPACITY: usize = 256;
const MAX_CONNS: usize = 4096;
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

/// Why a frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first four bytes are not `"LNDM"`.
    #[error("bad frame magic")]
    BadMagic,
    /// An unknown format version.
    #[error("unsupported frame version {0}")]
    BadVersion(u8),
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

/// Side-channel counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideStats {
    /// Frames fully written to a socket.
    pub sent: u64,
    /// Frames received and queued for the CM.
    pub received: u64,
    /// Frames dropped before sending (queue full, too old, too many peers).
    pub tx_dropped: u64,
    /// Frames dropped after receipt (receive queue full).
    pub rx_dropped: u64,
    /// Connections closed for a malformed frame.
    pub malformed: u64,
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

enum Dir {
    /// Send-only connection to a peer.
    Out { ip: Ipv4Addr, connected: bool },
    /// Receive-only connection from a peer.
    In { peer: SocketAddr },
}

struct Conn {
    stream: TcpStream,
    dir: Dir,
    rx: Box<[u8; FRAME_LEN]>,
    rx_len: usize,
    last_io: Instant,
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

/// The TCP MAD transport (see the module docs).
pub struct SideChannel {
    poll: Poll,
    events: Events,
    listener: TcpListener,
    local: FrameHeader,
    peer_port: u16,
    conns: Slab<Conn>,
    peers: HashMap<Ipv4Addr, Peer>,
    rx: VecDeque<(Ipv4Addr, Mad)>,
    dirty: VecDeque<Ipv4Addr>,
    learned: Arc<Mutex<HashMap<Ipv4Addr, PortAddr>>>,
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
    /// `local`. Addresses learned from received frames go into `learned`.
    pub fn bind(
        listen: SocketAddr,
        peer_port: u16,
        local: FrameHeader,
        learned: Arc<Mutex<HashMap<Ipv4Addr, PortAddr>>>,
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
            rx: VecDeque::new(),
            dirty: VecDeque::new(),
            learned,
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

    /// The next received MAD with its sender's address.
    pub fn recv(&mut self) -> Option<(Ipv4Addr, Mad)> {
        self.rx.pop_front()
    }

    /// Whether received MADs are waiting.
    pub fn has_rx(&self) -> bool {
        !self.rx.is_empty()
    }

    /// When `progress` must run again even if the fd stays quiet: now if sends are queued,
    /// else the earliest reconnect or the next idle sweep (only while connections exist).
    pub fn next_deadline(&self) -> Option<Instant> {
        if !self.dirty.is_empty() {
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
        loop {
            match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
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
                    if self.conns.len() >= MAX_CONNS {
                        continue; // dropping the stream closes it
                    }
                    if self.policy.require_privileged && peer.port() >= PROT_SOCK {
                        self.stats.refused_unprivileged += 1;
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let entry = self.conns.vacant_entry();
                    let token = token_of(entry.key());
                    if self.poll.registry().register(&mut stream, token, Interest::READABLE).is_err() {
                        continue;
                    }
                    entry.insert(Conn {
                        stream,
                        dir: Dir::In { peer },
                        rx: Box::new([0u8; FRAME_LEN]),
                        rx_len: 0,
                        last_io: self.now,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock ends the burst; anything else (EMFILE...) leaves the connection in
                // the backlog for the next readiness edge.
                Err(_) => break,
            }
        }
    }

    fn on_conn_event(&mut self, key: usize, writable: bool) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        match conn.dir {
            Dir::In { peer } => self.read_in(key, peer),
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

    fn read_in(&mut self, key: usize, peer: SocketAddr) {
        loop {
            let Some(conn) = self.conns.get_mut(key) else { return };
            let buf = conn.rx.get_mut(conn.rx_len..).unwrap_or_default();
            match conn.stream.read(buf) {
                Ok(0) => return self.close(key),
                Ok(n) => {
                    conn.last_io = self.now;
                    conn.rx_len += n;
                    if conn.rx_len < FRAME_LEN {
                        continue;
                    }
                    conn.rx_len = 0;
                    match decode_frame(&conn.rx) {
                        Ok((h, mad)) => self.deliver(h, peer, mad),
                        Err(_) => {
                            self.stats.malformed += 1;
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

    fn deliver(&mut self, h: FrameHeader, peer: SocketAddr, mad: Mad) {
        let ip = match (h.ip.is_unspecified(), peer) {
            (false, _) => h.ip,
            (true, SocketAddr::V4(a)) => *a.ip(),
            (true, SocketAddr::V6(a)) => match a.ip().to_ipv4_mapped() {
                Some(ip) => ip,
                None => {
                    self.stats.malformed += 1;
                    return;
                }
            },
        };
        {
            let mut learned = self.learned.lock().unwrap_or_else(|p| p.into_inner());
            if learned.len() < LEARNED_MAX || learned.contains_key(&ip) {
                learned.insert(ip, PortAddr { gid: h.gid, lid: h.lid });
            }
        }
        if self.rx.len() >= RX_QUEUE_MAX {
            self.stats.rx_dropped += 1;
            return;
        }
        self.stats.received += 1;
        self.rx.push_back((ip, mad));
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
                let connected = if self.policy.use_privileged {
                    match connect_from_reserved(addr) {
                        Ok(Some(s)) => Ok(s),
                        Ok(None) => {
                            self.stats.unprivileged_connects += 1;
                            TcpStream::connect(SocketAddr::V4(addr))
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    TcpStream::connect(SocketAddr::V4(addr))
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
            if let Dir::Out { ip, .. } = conn.dir {
                if let Some(p) = self.peers.get_mut(&ip) {
                    if p.conn == Some(key) {
                        p.conn = None;
                        p.front_sent = 0;
                    }
                }
            }
        }
    }

    /// Reopens stalled outgoing connections, closes idle ones and forgets idle peers.
    fn sweep(&mut self) {
        let now = self.now;
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

/// A non-blocking connection to `addr` from the highest free reserved port (1023 down to 512);
/// `Ok(None)` when this process may not bind reserved ports.
fn connect_from_reserved(addr: SocketAddrV4) -> io::Result<Option<TcpStream>> {
    for port in (RESERVED_MIN..PROT_SOCK).rev() {
        // SAFETY: socket(2) takes no pointers; the result is checked before use.
        let fd = unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a socket we just created and own from here on; the OwnedFd closes it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let local = sockaddr_in(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port));
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: binds our socket to a sockaddr_in that lives across the call, with its size.
        let r = unsafe { libc::bind(fd, std::ptr::addr_of!(local).cast(), len) };
        if r != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EADDRINUSE) => continue,
                Some(libc::EACCES | libc::EPERM) => return Ok(None),
                _ => return Err(e),
            }
        }
        let remote = sockaddr_in(addr);
        // SAFETY: connects our socket to a sockaddr_in that lives across the call, with its size.
        let r = unsafe { libc::connect(fd, std::ptr::addr_of!(remote).cast(), len) };
        if r != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINPROGRESS) => {}
                // The 4-tuple is taken (a connection to the same peer from this port).
                Some(libc::EADDRNOTAVAIL | libc::EADDRINUSE) => continue,
                _ => return Err(e),
            }
        }
        return Ok(Some(TcpStream::from_std(std::net::TcpStream::from(owned))));
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
    use std::io::Write as _;

    use super::*;

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

    fn learned() -> Arc<Mutex<HashMap<Ipv4Addr, PortAddr>>> {
        Arc::new(Mutex::new(HashMap::new()))
    }

    fn channel(last: u8, peer_port: u16) -> SideChannel {
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        SideChannel::bind(listen, peer_port, header(last), learned()).unwrap()
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
        let learned = b.learned.lock().unwrap().get(&Ipv4Addr::LOCALHOST).copied();
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
}
