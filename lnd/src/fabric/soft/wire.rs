//! What carries the software device's frames: real UDP sockets or the simulated wire.
//!
//! A [`Wire`] moves RoCEv2 UDP payloads (BTH .. ICRC) between IPv4 ports. [`UdpWire`] binds a
//! real socket on `ip:4791`; [`super::sim::SimPort`] attaches to an in-process network with a
//! virtual clock. [`super::fault::FaultyWire`] wraps either one to drop, duplicate, reorder,
//! delay or corrupt frames. Everything is non-blocking; `now` is passed in so the simulated wire
//! and delayed frames need no clock of their own.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use lnet_shim::hash::FastMap;

use super::place::LocalPeer;
use super::registry;
use super::ring::{self, Pushed, RingRx, RingTx};
use crate::time::Instant;

/// A datagram transport between IPv4 ports.
pub trait Wire: Send {
    /// The local address.
    fn local_ip(&self) -> Ipv4Addr;
    /// The UDP port every port of this fabric listens on (4791 for RoCEv2).
    fn udp_port(&self) -> u16;
    /// Sends one frame to `dst`. `WouldBlock` means the frame was not sent.
    fn send(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()>;
    /// Sends consecutive frames of `seg` bytes each (the last may be shorter) to `dst`, as one
    /// batch where the transport can (UDP GSO); each is still a datagram of its own.
    fn send_segments(&mut self, now: Instant, dst: Ipv4Addr, frames: &[u8], seg: usize) -> io::Result<()> {
        for frame in frames.chunks(seg.max(1)) {
            self.send(now, dst, frame)?;
        }
        Ok(())
    }
    /// Sends consecutive frames of `seg` bytes each (as [`Wire::send_segments`]) whose ICRC
    /// the sender left uncomputed because [`Wire::immediate_route`] said `dst` is behind a
    /// same-host ring with nothing in between ([`super::ring`], "Unsealed frames"). Each goes
    /// into the ring marked unsealed; one that cannot (the route changed since) is sealed here
    /// and sent as any other, which is all this default does.
    fn send_unsealed(
        &mut self,
        now: Instant,
        dst: Ipv4Addr,
        frames: &mut [u8],
        seg: usize,
    ) -> io::Result<()> {
        seal_and_send(self, now, dst, frames, seg)
    }
    /// Receives into `buf`: one frame, or (with [`Received::seg`] non-zero) several
    /// coalesced frames of `seg` bytes each, the last possibly shorter. `Ok(None)` when nothing
    /// is waiting.
    fn recv(&mut self, now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>>;
    /// The fd that becomes readable when frames arrive, if there is one.
    fn raw_fd(&self) -> Option<RawFd>;
    /// An edge-triggered poller saw [`Wire::raw_fd`] become readable (see
    /// [`crate::fabric::Device::fd_readable`]): from the first call on, the wire may answer
    /// `recv` with `Ok(None)` without a system call after it found the fd empty, until the next.
    fn readable(&mut self) {}
    /// When a frame held back (delayed, or in flight on a simulated link) becomes deliverable.
    fn next_deadline(&self) -> Option<Instant>;
    /// Whether the wire runs on a virtual clock (the simulation, [`super::sim`]): then nothing
    /// the device does may depend on how the OS schedules its threads, so that a seed replays
    /// a run exactly.
    fn virtual_clock(&self) -> bool {
        false
    }
    /// This port's process and identity for the same-host path ([`super::place`]), if it
    /// offers it (published for peers to find).
    fn local_peer(&self) -> Option<LocalPeer> {
        None
    }
    /// The process on this host that owns port `ip`, if it offers the same-host path.
    fn lookup_peer(&self, _ip: Ipv4Addr) -> Option<LocalPeer> {
        None
    }
    /// The caller is about to sleep in its poller until [`Wire::raw_fd`] is readable or a
    /// deadline passes: a wire whose peers can deliver without making the fd readable (the
    /// same-host rings) asks them to ring its doorbell from now on. False if a frame arrived
    /// meanwhile: then the caller must not sleep (the wire is awake again).
    fn prepare_to_sleep(&mut self) -> bool {
        true
    }
    /// The caller woke up after [`Wire::prepare_to_sleep`] said it may sleep.
    fn awake(&mut self) {}
    /// Withdraws from the same-host path: the registry entry and the rings are removed (a
    /// device shutting down; until it is dropped, frames go by UDP).
    fn close_same_host(&mut self) {}
    /// Counters of the same-host rings.
    fn ring_stats(&self) -> RingStats {
        RingStats::default()
    }
    /// Whether [`Wire::recv`] may have a frame now, answered without a system call (true
    /// when unsure): for a spinning caller deciding whether to poll at all.
    fn rx_pending(&self) -> bool {
        true
    }
    /// Whether frames to `dst` leave without a system call (a same-host ring is open to it),
    /// so that sending each as soon as it is posted loses nothing to batching.
    fn immediate_route(&self, _dst: Ipv4Addr) -> bool {
        false
    }
    /// Frames sent and received through the wire's socket so far (not through same-host
    /// rings, not doorbells), if it has one: a count that moves while traffic depends on the
    /// caller's poller reporting the socket.
    fn socket_frames(&self) -> Option<u64> {
        None
    }
}

/// Counters of a wire's same-host rings ([`super::ring`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Frames sent through rings.
    pub sent: u64,
    /// Frames received from rings.
    pub received: u64,
    /// Doorbells sent (a consumer was asleep).
    pub doorbells: u64,
    /// Frames dropped because a ring was full.
    pub full: u64,
    /// Rings given up (not a ring of ours, or a producer that broke the rules).
    pub refused: u64,
    /// Frames sent through rings unsealed (no ICRC computed).
    pub unsealed_sent: u64,
    /// Frames received from rings unsealed (parsed without the ICRC check).
    pub unsealed_received: u64,
}

/// Where received frames came from and how long they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Source address.
    pub src: Ipv4Addr,
    /// Source UDP port.
    pub src_port: u16,
    /// Bytes written to the buffer.
    pub len: usize,
    /// 0 for a single frame; otherwise the buffer holds frames of this size (UDP GRO), the
    /// last one possibly shorter.
    pub seg: usize,
    /// False for a frame whose ICRC its sender did not compute: one that came through a
    /// same-host ring straight from the sending device ([`super::ring`], "Unsealed frames").
    pub sealed: bool,
}

impl Received {
    /// A single sealed frame of `len` bytes.
    pub fn single(src: Ipv4Addr, src_port: u16, len: usize) -> Received {
        Received { src, src_port, len, seg: 0, sealed: true }
    }
}

/// Computes the ICRC of each of the frames of `seg` bytes (the last possibly shorter) in
/// `frames`, from `wire` to `dst`, and sends them as [`Wire::send_segments`]: how a wire sends
/// unsealed frames it cannot carry unsealed. A frame too malformed to seal is sent as it is;
/// its receiver drops it.
pub(crate) fn seal_and_send<W: Wire + ?Sized>(
    wire: &mut W,
    now: Instant,
    dst: Ipv4Addr,
    frames: &mut [u8],
    seg: usize,
) -> io::Result<()> {
    let port = wire.udp_port();
    let meta = super::packet::IcrcMeta::new(wire.local_ip(), dst, port, port);
    for frame in frames.chunks_mut(seg.max(1)) {
        let _ = super::packet::seal(&meta, frame);
    }
    wire.send_segments(now, dst, frames, seg)
}

/// A real UDP socket bound to one IPv4 address.
///
/// Batches use the kernel's UDP segmentation offload when it has it (`UDP_SEGMENT` on send,
/// `UDP_GRO` on receive): one system call moves up to [`MAX_GSO_SEGMENTS`] frames, each still
/// a datagram of its own on the wire. Without them it falls back to one datagram per call.
#[derive(Debug)]
pub struct UdpWire {
    socket: UdpSocket,
    ip: Ipv4Addr,
    port: u16,
    gso: bool,
    gro: bool,
    /// The driver tells us of readiness edges ([`Wire::readable`]).
    edge_driven: bool,
    /// Edge-driven and the socket was found empty since the last edge.
    drained: bool,
    /// Between a [`Wire::prepare_to_sleep`] that said yes and the [`Wire::awake`] after it:
    /// the consumer's rings say it may sleep, and a ring mapped meanwhile (by another thread
    /// driving the device) must say so too.
    asleep: bool,
    registry: Option<registry::Entry>,
    /// Same-host rings ([`super::ring`]): ours to each destination, and theirs to us.
    rings_tx: FastMap<Ipv4Addr, TxRoute>,
    rings_rx: Vec<(Ipv4Addr, u16, RingRx)>,
    rx_next: usize,
    ring_stats: RingStats,
    /// Frames sent and received through the socket ([`Wire::socket_frames`]).
    socket_frames: u64,
}

/// How frames to one destination travel.
#[derive(Debug)]
struct TxRoute {
    /// The ring to it, and the peer's registry identity it was made for; `None`: by UDP.
    ring: Option<(RingTx, LocalPeer)>,
    /// When the registry was last consulted about this destination.
    checked: Option<Instant>,
    /// A failure to make the ring was reported (once; it is retried at each re-check).
    warned: bool,
}

/// How often a destination's registry entry is looked at again (a peer that appeared, or
/// restarted and needs a new ring).
const ROUTE_RECHECK: Duration = Duration::from_secs(1);

/// `UDP_SEGMENT` (linux/udp.h): segment size for UDP GSO.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): receive coalesced datagrams.
const UDP_GRO: libc::c_int = 104;
/// Most frames one GSO send carries (the kernel allows 64; the IP length limit binds first).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Largest GSO send: the IP datagram limit minus IP and UDP headers.
pub const MAX_GSO_BYTES: usize = 65_507;

/// Socket buffer size the wire asks for: several full windows of 4 KiB frames.
const SOCKET_BUFFER: usize = 32 << 20;

impl UdpWire {
    /// Binds `ip:port` (non-blocking, don't-fragment so the kernel sends IP ID 0, which the
    /// ICRC covers; large socket buffers).
    pub fn bind(ip: Ipv4Addr, port: u16) -> io::Result<UdpWire> {
        let socket = UdpSocket::bind(SocketAddrV4::new(ip, port))?;
        socket.set_nonblocking(true)?;
        let fd = socket.as_raw_fd();
        set_int_opt(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
        for (force, plain) in
            [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)]
        {
            // FORCE needs CAP_NET_ADMIN; without it the plain option clamps to rmem_max.
            if set_int_opt(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER as libc::c_int).is_err() {
                set_int_opt(fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER as libc::c_int)?;
            }
        }
        let port = match socket.local_addr()? {
            SocketAddr::V4(a) => a.port(),
            SocketAddr::V6(a) => a.port(),
        };
        let gro = set_int_opt(fd, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        Ok(UdpWire {
            socket,
            ip,
            port,
            gso: true,
            gro,
            edge_driven: false,
            drained: false,
            asleep: false,
            registry: None,
            rings_tx: FastMap::default(),
            rings_rx: Vec::new(),
            rx_next: 0,
            ring_stats: RingStats::default(),
            socket_frames: 0,
        })
    }

    /// Offers the same-host path: publishes this process as the owner of the port in the
    /// registry ([`super::registry`]) with identity `nonce`. Only loopback ports take part;
    /// for others this does nothing.
    pub fn publish(&mut self, nonce: u64) -> io::Result<()> {
        if self.ip.is_loopback() {
            self.registry = Some(registry::publish(self.ip, self.port, nonce)?);
        }
        Ok(())
    }

    /// The ring to `dst`, if frames to it go through one (a same-host port that offers the
    /// path); made, or remade for a restarted peer, as the registry says.
    fn ring_to(&mut self, now: Instant, dst: Ipv4Addr) -> Option<&mut RingTx> {
        if self.registry.is_none() || !dst.is_loopback() || dst == self.ip {
            return None;
        }
        let (ip, port) = (self.ip, self.port);
        let route = self.rings_tx.entry(dst).or_insert(TxRoute { ring: None, checked: None, warned: false });
        if route.checked.is_none_or(|t| now.saturating_duration_since(t) >= ROUTE_RECHECK) {
            route.checked = Some(now);
            let peer = registry::lookup(dst, port);
            let current = route.ring.as_ref().map(|(_, p)| *p);
            if peer != current {
                route.ring = None;
                if let Some(p) = peer {
                    let made = registry::dir().and_then(|d| {
                        RingTx::create(&ring::ring_path(&d, ip, port, dst), crate::rng::os_seed())
                    });
                    match made {
                        Ok(r) => (route.ring, route.warned) = (Some((r, p)), false),
                        Err(e) if !route.warned => {
                            route.warned = true;
                            eprintln!(
                                "lnd: {ip}: no same-host ring to {dst}, using UDP (retried each second): {e}"
                            );
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        route.ring.as_mut().map(|(r, _)| r)
    }

    /// Puts `frame` into the ring to `dst`, ringing its doorbell if the consumer may sleep;
    /// `sealed` false: its ICRC was not computed. `None` if there is no ring to `dst`.
    fn push_ring(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8], sealed: bool) -> Option<()> {
        let port = self.port;
        let ring = self.ring_to(now, dst)?;
        let pushed = ring.push_record(frame, sealed);
        let bell = ring::doorbell(ring.nonce());
        if !sealed && pushed != Pushed::Full {
            self.ring_stats.unsealed_sent += 1;
        }
        match pushed {
            Pushed::Queued => self.ring_stats.sent += 1,
            Pushed::RingDoorbell => {
                self.ring_stats.sent += 1;
                self.ring_stats.doorbells += 1;
                // Lost (the peer's port is gone): RC retransmits, and its ring re-check finds
                // out. The frame itself is in the ring either way.
                let _ = self.socket.send_to(&bell, SocketAddrV4::new(dst, port));
            }
            Pushed::Full => self.ring_stats.full += 1,
        }
        Some(())
    }

    /// A doorbell from `src:src_port` for its ring with `nonce`: map the ring if it is new;
    /// the doorbell is spent either way ([`RingRx::doorbell_heard`]), and the caller looks at
    /// the rings next.
    fn on_doorbell(&mut self, src: Ipv4Addr, src_port: u16, nonce: u64) {
        if self.registry.is_none() || !src.is_loopback() || src_port != self.port {
            return;
        }
        if let Some(i) = self.rings_rx.iter().position(|(ip, _, _)| *ip == src) {
            if let Some((_, _, r)) = self.rings_rx.get(i).filter(|(_, _, r)| r.nonce() == nonce) {
                r.doorbell_heard();
                return;
            }
            self.rings_rx.swap_remove(i);
        }
        let opened = registry::dir()
            .map_err(|_| ring::RingError::NotARing)
            .and_then(|d| RingRx::open(&ring::ring_path(&d, src, src_port, self.ip), nonce));
        match opened {
            Ok(r) => {
                r.doorbell_heard();
                // Opening marks a ring awake; while the thread that sleeps on the socket is
                // asleep, the ring must ring its doorbell instead, as the others do.
                if self.asleep {
                    r.prepare_to_sleep();
                }
                self.rings_rx.push((src, src_port, r));
            }
            Err(_) => self.ring_stats.refused += 1,
        }
    }

    /// [`Wire::recv`] from the socket (the rings had nothing and the socket is not known to be
    /// drained): a datagram, or a doorbell, after which the rings are looked at again.
    #[inline(never)]
    fn recv_socket(&mut self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        loop {
            let r = if self.gro {
                self.recv_gro(buf)
            } else {
                match self.socket.recv_from(buf) {
                    Ok((len, SocketAddr::V4(src))) => Ok(Received::single(*src.ip(), src.port(), len)),
                    Ok((_, SocketAddr::V6(_))) => continue,
                    Err(e) => Err(e),
                }
            };
            return match r {
                Ok(r) => {
                    let doorbell = (r.len == ring::DOORBELL_LEN && r.seg == 0)
                        .then(|| buf.get(..r.len).and_then(ring::parse_doorbell))
                        .flatten();
                    if let Some(nonce) = doorbell {
                        self.on_doorbell(r.src, r.src_port, nonce);
                        if let Some(f) = self.recv_ring(buf) {
                            return Ok(Some(f));
                        }
                        continue;
                    }
                    self.socket_frames += 1;
                    Ok(Some(r))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.drained = self.edge_driven;
                    Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }

    /// The next frame from a ring (round robin over them).
    fn recv_ring(&mut self, buf: &mut [u8]) -> Option<Received> {
        let n = self.rings_rx.len();
        let mut i = if self.rx_next < n { self.rx_next } else { 0 };
        for _ in 0..n {
            let (src, src_port, ring) = self.rings_rx.get_mut(i)?;
            let next = if i + 1 == n { 0 } else { i + 1 };
            match ring.pop(buf) {
                Ok(Some(p)) => {
                    self.rx_next = next;
                    self.ring_stats.received += 1;
                    if !p.sealed {
                        self.ring_stats.unsealed_received += 1;
                    }
                    return Some(Received { sealed: p.sealed, ..Received::single(*src, *src_port, p.len) });
                }
                Ok(None) => {}
                Err(e) => {
                    eprintln!("lnd: {}: the same-host ring from {src} is dropped: {e:?}", self.ip);
                    self.ring_stats.refused += 1;
                    self.rings_rx.swap_remove(i);
                    return self.recv_ring(buf);
                }
            }
            i = next;
        }
        None
    }

    /// One `sendmsg` with a `UDP_SEGMENT` control message.
    fn send_gso(&self, dst: Ipv4Addr, frames: &[u8], seg: u16) -> io::Result<()> {
        let addr = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: self.port.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(dst).to_be() },
            sin_zero: [0; 8],
        };
        let mut iov = libc::iovec { iov_base: frames.as_ptr() as *mut libc::c_void, iov_len: frames.len() };
        // Room for one cmsg carrying a u16, aligned as cmsghdr requires.
        let mut control = [0u64; 4];
        // SAFETY: an all-zero msghdr is a valid empty message; every pointer set below points to
        // a live local (address, iovec, control buffer) that outlives the sendmsg call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&addr as *const libc::sockaddr_in).cast_mut().cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) } as usize;
        // SAFETY: msg_control points to `control` (32 bytes, 8-aligned), which holds
        // CMSG_SPACE(2) = 24 bytes, so CMSG_FIRSTHDR returns a header inside it and CMSG_DATA
        // leaves room for the u16 written (unaligned write: no alignment assumed).
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), seg);
        }
        // SAFETY: `msg` describes live buffers as established above; the kernel only reads.
        let n = unsafe { libc::sendmsg(self.socket.as_raw_fd(), &msg, 0) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// One `recvmsg`, reporting the GRO segment size if the kernel coalesced datagrams.
    fn recv_gro(&self, buf: &mut [u8]) -> io::Result<Received> {
        // SAFETY: an all-zero sockaddr_in is a valid (unspecified) address for the kernel to fill.
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut control = [0u64; 8];
        // SAFETY: as in `send_gso`: zeroed msghdr, pointers to live locals and to `buf`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut addr as *mut libc::sockaddr_in).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: the kernel writes at most iov_len bytes into `buf`, msg_namelen into `addr`
        // and msg_controllen into `control`, all live for the call.
        let n = unsafe { libc::recvmsg(self.socket.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut seg = 0usize;
        // SAFETY: the control buffer was filled by the kernel; CMSG_FIRSTHDR/NXTHDR walk it
        // within msg_controllen and CMSG_DATA of a UDP_GRO cmsg holds an int (read unaligned).
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == UDP_GRO {
                    let v = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                    seg = usize::try_from(v).unwrap_or(0);
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        let len = n as usize;
        let src = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
        let seg = if seg > 0 && seg < len { seg } else { 0 };
        Ok(Received { src, src_port: u16::from_be(addr.sin_port), len, seg, sealed: true })
    }
}

fn set_int_opt(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

impl Wire for UdpWire {
    fn local_ip(&self) -> Ipv4Addr {
        self.ip
    }

    fn udp_port(&self) -> u16 {
        self.port
    }

    fn send(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()> {
        if self.push_ring(now, dst, frame, true).is_some() {
            return Ok(());
        }
        match self.socket.send_to(frame, SocketAddrV4::new(dst, self.port)) {
            Ok(_) => {
                self.socket_frames += 1;
                Ok(())
            }
            // An ICMP port-unreachable from an earlier frame: the peer's port is gone. RC
            // retransmission deals with it; the frame counts as lost.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn send_segments(&mut self, now: Instant, dst: Ipv4Addr, frames: &[u8], seg: usize) -> io::Result<()> {
        if !self.gso
            || frames.len() <= seg
            || seg == 0
            || seg > usize::from(u16::MAX)
            || self.ring_to(now, dst).is_some()
        {
            for frame in frames.chunks(seg.max(1)) {
                self.send(now, dst, frame)?;
            }
            return Ok(());
        }
        match self.send_gso(dst, frames, seg as u16) {
            Ok(()) => {
                self.socket_frames += frames.len().div_ceil(seg) as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
            // No GSO in this kernel or for this route: one datagram per call from now on.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EOPNOTSUPP)) => {
                self.gso = false;
                self.send_segments(now, dst, frames, seg)
            }
            Err(e) => Err(e),
        }
    }

    fn send_unsealed(
        &mut self,
        now: Instant,
        dst: Ipv4Addr,
        frames: &mut [u8],
        seg: usize,
    ) -> io::Result<()> {
        let seg = seg.max(1);
        let mut at = 0;
        while at < frames.len() {
            let end = frames.len().min(at + seg);
            let frame = frames.get(at..end).unwrap_or_default();
            if self.push_ring(now, dst, frame, false).is_none() {
                // The ring went away since the caller looked: the rest go sealed, by UDP.
                return seal_and_send(self, now, dst, frames.get_mut(at..).unwrap_or_default(), seg);
            }
            at = end;
        }
        Ok(())
    }

    fn recv(&mut self, _now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>> {
        if let Some(r) = self.recv_ring(buf) {
            return Ok(Some(r));
        }
        if self.drained {
            return Ok(None);
        }
        self.recv_socket(buf)
    }

    fn readable(&mut self) {
        self.edge_driven = true;
        self.drained = false;
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.socket.as_raw_fd())
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }

    fn local_peer(&self) -> Option<LocalPeer> {
        self.registry.as_ref().map(|e| e.me)
    }

    fn lookup_peer(&self, ip: Ipv4Addr) -> Option<LocalPeer> {
        // Loopback to loopback only: nothing from outside the host can carry such a source.
        if self.registry.is_none() || !ip.is_loopback() {
            return None;
        }
        registry::lookup(ip, self.port)
    }

    fn prepare_to_sleep(&mut self) -> bool {
        if self.rings_rx.iter().all(|(_, _, r)| r.prepare_to_sleep()) {
            self.asleep = true;
            return true;
        }
        self.awake();
        false
    }

    fn awake(&mut self) {
        self.asleep = false;
        for (_, _, r) in &self.rings_rx {
            r.awake();
        }
    }

    /// A frame in a ring, or a socket not known to be drained (until the poller has reported
    /// the socket once, it is never known to be).
    fn rx_pending(&self) -> bool {
        !self.drained || self.rings_rx.iter().any(|(_, _, r)| !r.is_empty())
    }

    fn immediate_route(&self, dst: Ipv4Addr) -> bool {
        self.rings_tx.get(&dst).is_some_and(|r| r.ring.is_some())
    }

    fn close_same_host(&mut self) {
        self.registry = None;
        self.rings_tx.clear();
        self.rings_rx.clear();
    }

    fn ring_stats(&self) -> RingStats {
        self.ring_stats
    }

    fn socket_frames(&self) -> Option<u64> {
        Some(self.socket_frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (bounded) for `w`'s socket to become readable.
    fn readable(w: &UdpWire, ms: i32) -> bool {
        let mut p = libc::pollfd { fd: w.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd, count 1.
        unsafe { libc::poll(&mut p, 1, ms) > 0 }
    }

    fn recv_frame(w: &mut UdpWire) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 70_000];
        for _ in 0..1000 {
            if let Some(r) = w.recv(Instant::ZERO, &mut buf).unwrap() {
                return Some(buf[..r.len].to_vec());
            }
            if !readable(w, 2000) {
                return None;
            }
        }
        None
    }

    /// Three ports on `127.0.<net>.1..=3` sharing a port number derived from `base` and the
    /// pid: the first two publish (the same-host path on, nonces `nonce` and `nonce + 1`),
    /// the third does not.
    fn three_ports(net: u8, base: u16, nonce: u64) -> (u16, [Ipv4Addr; 3], [UdpWire; 3]) {
        let port = base + (std::process::id() % 5000) as u16;
        let ips = [1, 2, 3].map(|h| Ipv4Addr::new(127, 0, net, h));
        let mut w = ips.map(|ip| UdpWire::bind(ip, port).unwrap());
        w[0].publish(nonce).unwrap();
        w[1].publish(nonce + 1).unwrap();
        (port, ips, w)
    }

    /// Two same-host ports with the path on: frames go through the ring, a sleeping consumer
    /// is woken by a doorbell, an awake one is not rung; a port without the path uses UDP.
    #[test]
    fn same_host_frames_take_the_ring_and_wake_a_sleeping_consumer() {
        let (port, [ia, ib, ic], [mut a, mut b, mut c]) = three_ports(41, 30_000, 1);
        let now = Instant::from_nanos(1);
        assert!(!a.immediate_route(ib), "no ring before the first frame");
        // First frame: a new ring, the consumer unknown: doorbell, then the frame from the ring.
        a.send(now, ib, b"first").unwrap();
        assert!(a.immediate_route(ib), "the ring is open");
        assert_eq!(recv_frame(&mut b).as_deref(), Some(&b"first"[..]));
        // Until a poller reports the socket, a frame may be waiting in it; once it did and
        // the socket is drained, only a frame in a ring is (no system call to tell).
        assert!(b.rx_pending(), "the socket was never reported readable");
        b.readable();
        let mut buf = vec![0u8; 2048];
        assert_eq!(b.recv(now, &mut buf).unwrap(), None);
        assert!(!b.rx_pending(), "ring empty, socket drained");
        // Awake consumer: no doorbell.
        a.send(now, ib, b"second").unwrap();
        assert!(b.rx_pending(), "a frame in the ring");
        assert_eq!(recv_frame(&mut b).as_deref(), Some(&b"second"[..]));
        assert_eq!((a.ring_stats().sent, a.ring_stats().doorbells), (2, 1));
        // Sleeping consumer: rung once.
        assert!(b.prepare_to_sleep());
        a.send(now, ib, b"third").unwrap();
        assert!(readable(&b, 2000), "the doorbell makes the socket readable");
        b.awake();
        assert_eq!(recv_frame(&mut b).as_deref(), Some(&b"third"[..]));
        assert_eq!((a.ring_stats().doorbells, b.ring_stats().received), (2, 3));
        // Segments go frame by frame through the ring.
        a.send_segments(now, ib, &[9u8; 300], 100).unwrap();
        for _ in 0..3 {
            assert_eq!(recv_frame(&mut b), Some(vec![9u8; 100]));
        }
        // To and from a port without the path: UDP.
        a.send(now, ic, b"udp").unwrap();
        assert!(!a.immediate_route(ic), "UDP frames are batched: no immediate route");
        assert_eq!(recv_frame(&mut c).as_deref(), Some(&b"udp"[..]));
        c.send(now, ia, b"back").unwrap();
        assert_eq!(recv_frame(&mut a).as_deref(), Some(&b"back"[..]));
        assert_eq!((a.ring_stats().sent, c.ring_stats().sent), (6, 0));
        // A forged doorbell naming no ring of ours is refused and changes nothing.
        c.socket.send_to(&ring::doorbell(77), SocketAddrV4::new(ib, port)).unwrap();
        assert!(readable(&b, 2000));
        b.readable(); // as the poller would report it
        assert!(b.rx_pending());
        assert_eq!(b.recv(now, &mut buf).unwrap(), None);
        assert_eq!(b.ring_stats().refused, 1, "no such ring: refused, nothing else changes");
    }

    /// `socket_frames` counts what moved through the socket and nothing else: frames through a
    /// ring and the doorbells that wake their consumer stay out, UDP frames each way count. A
    /// spinning scheduler slows its poller on that count (`driver::pacing`).
    #[test]
    fn socket_frames_count_udp_frames_but_not_ring_frames_or_doorbells() {
        let (_, [ia, ib, ic], [mut a, mut b, mut c]) = three_ports(47, 47_000, 7);
        let now = Instant::from_nanos(1);
        // Through the ring, the first one after a doorbell over the socket.
        a.send(now, ib, b"ring").unwrap();
        assert_eq!(recv_frame(&mut b).as_deref(), Some(&b"ring"[..]));
        assert_eq!(a.ring_stats().doorbells, 1);
        assert_eq!((a.socket_frames(), b.socket_frames()), (Some(0), Some(0)));
        // By UDP, both ways: one each time on each side.
        a.send(now, ic, b"udp").unwrap();
        assert_eq!(recv_frame(&mut c).as_deref(), Some(&b"udp"[..]));
        c.send(now, ia, b"back").unwrap();
        assert_eq!(recv_frame(&mut a).as_deref(), Some(&b"back"[..]));
        assert_eq!((a.socket_frames(), c.socket_frames()), (Some(2), Some(2)));
        assert_eq!(b.socket_frames(), Some(0));
    }

    /// Unsealed frames go into the ring marked so, and come out with `sealed` false; where
    /// there is no ring (a port without the same-host path), the wire seals them and they go
    /// by UDP with a correct ICRC.
    #[test]
    fn unsealed_frames_ride_the_ring_marked_and_are_sealed_where_there_is_none() {
        use super::super::packet::{self, Bth, Headers, IcrcMeta, Opcode};
        let (port, [ia, ib, ic], [mut a, mut b, mut c]) = three_ports(45, 45_000, 5);
        let now = Instant::from_nanos(1);
        let headers = Headers::new(Bth::new(Opcode::RcSendOnly, 7, 1));
        let frame = |dst: Ipv4Addr| {
            let mut f = Vec::new();
            packet::build(&IcrcMeta::new(ia, dst, port, port), &headers, b"payload!", &mut f).unwrap();
            packet::seal_without_icrc(&mut f).unwrap();
            f
        };
        a.send(now, ib, b"opens the ring").unwrap();
        assert_eq!(recv_frame(&mut b).as_deref(), Some(&b"opens the ring"[..]));
        let mut f = frame(ib);
        let n = f.len();
        a.send_unsealed(now, ib, &mut f, n).unwrap();
        let mut buf = vec![0u8; 2048];
        let r = b.recv(now, &mut buf).unwrap().expect("in the ring");
        assert!(!r.sealed, "{r:?}");
        assert!(packet::parse_unchecked(&buf[..r.len]).is_ok());
        assert_eq!((a.ring_stats().unsealed_sent, b.ring_stats().unsealed_received), (1, 1));
        // No ring to c: sealed by the wire, checked by the receiver as any datagram.
        let mut f = frame(ic);
        let n = f.len();
        a.send_unsealed(now, ic, &mut f, n).unwrap();
        let got = recv_frame(&mut c).expect("by UDP");
        assert!(packet::parse(&IcrcMeta::new(ia, ic, port, port), &got).is_ok(), "sealed on the way");
        assert_eq!(a.ring_stats().unsealed_sent, 1);
    }

    /// The sleep/doorbell handshake under a racing producer: the consumer sleeps whenever its
    /// rings are empty (poll on the socket with a long timeout); the producer pushes one frame
    /// at an irregular moment, then waits until it was consumed, so each frame is the last one
    /// and a lost wake-up would leave it waiting out the timeout.
    #[test]
    fn no_frame_waits_for_a_sleeping_consumer() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU32, Ordering};
        let port = 35_000 + (std::process::id() % 5000) as u16;
        let (ia, ib) = (Ipv4Addr::new(127, 0, 42, 1), Ipv4Addr::new(127, 0, 42, 2));
        let mut a = UdpWire::bind(ia, port).unwrap();
        let mut b = UdpWire::bind(ib, port).unwrap();
        a.publish(3).unwrap();
        b.publish(4).unwrap();
        const N: u32 = 2000;
        let consumed = Arc::new(AtomicU32::new(0));
        let seen = consumed.clone();
        let producer = std::thread::spawn(move || {
            let mut x = 0x9e37_79b9u32;
            for i in 0..N {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                for _ in 0..(x % 4000) {
                    std::hint::spin_loop();
                }
                a.send(Instant::from_nanos(1), ib, &i.to_le_bytes()).unwrap();
                let mut spins = 0u64;
                while seen.load(Ordering::Acquire) <= i {
                    spins += 1;
                    assert!(spins < 4_000_000_000, "frame {i} never consumed");
                    std::hint::spin_loop();
                }
            }
            a.ring_stats()
        });
        let mut buf = vec![0u8; 70_000];
        let mut next = 0u32;
        let mut sleeps = 0u32;
        while next < N {
            while let Some(r) = b.recv(Instant::ZERO, &mut buf).unwrap() {
                if r.len == 4 {
                    assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), next, "in order");
                    next += 1;
                    consumed.store(next, Ordering::Release);
                }
            }
            if next == N || !b.prepare_to_sleep() {
                continue;
            }
            sleeps += 1;
            assert!(readable(&b, 10_000), "lost wake-up: frame {next} of {N} never rang");
            b.readable();
            b.awake();
        }
        let st = producer.join().unwrap();
        assert!(
            sleeps > 0 && st.doorbells > 0,
            "the consumer slept ({sleeps}) and was rung ({})",
            st.doorbells
        );
    }
}
