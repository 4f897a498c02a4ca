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

use crate::time::Instant;

/// A datagram transport between IPv4 ports.
pub trait Wire: Send {
    /// The local address.
    fn local_ip(&self) -> Ipv4Addr;
    /// The UDP port every port of this fabric listens on (4791 for RoCEv2).
    fn udp_port(&self) -> u16;
    /// Sends one frame to `dst`. `WouldBlock` means the frame was not sent.
    fn send(&mut self, now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()>;
    /// Receives one frame into `buf`: `Ok(None)` when nothing is waiting.
    fn recv(&mut self, now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>>;
    /// The fd that becomes readable when frames arrive, if there is one.
    fn raw_fd(&self) -> Option<RawFd>;
    /// When a frame held back (delayed, or in flight on a simulated link) becomes deliverable.
    fn next_deadline(&self) -> Option<Instant>;
}

/// Where a received frame came from and how long it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Source address.
    pub src: Ipv4Addr,
    /// Source UDP port.
    pub src_port: u16,
    /// Frame length (bytes written to the buffer).
    pub len: usize,
}

/// A real UDP socket bound to one IPv4 address.
#[derive(Debug)]
pub struct UdpWire {
    socket: UdpSocket,
    ip: Ipv4Addr,
    port: u16,
}

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
        Ok(UdpWire { socket, ip, port })
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

    fn send(&mut self, _now: Instant, dst: Ipv4Addr, frame: &[u8]) -> io::Result<()> {
        match self.socket.send_to(frame, SocketAddrV4::new(dst, self.port)) {
            Ok(_) => Ok(()),
            // An ICMP port-unreachable from an earlier frame: the peer's port is gone. RC
            // retransmission deals with it; the frame counts as lost.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn recv(&mut self, _now: Instant, buf: &mut [u8]) -> io::Result<Option<Received>> {
        loop {
            return match self.socket.recv_from(buf) {
                Ok((len, SocketAddr::V4(src))) => {
                    Ok(Some(Received { src: *src.ip(), src_port: src.port(), len }))
                }
                Ok((_, SocketAddr::V6(_))) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.socket.as_raw_fd())
    }

    fn next_deadline(&self) -> Option<Instant> {
        None
    }
}
