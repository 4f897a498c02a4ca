//! Peers (`kib_peer_ni`): what the engine remembers about each remote NID between connections.
//!
//! A peer holds its connections, the transmits waiting for one, the parameters negotiated last
//! time (queue depth and fragments, which only ever shrink, LU-3322), the peer's incarnation
//! (a changed stamp means it restarted), the connection-race count, and the pacing of reconnects
//! after rejects: ten at once, then at most one a second (o2iblnd's `KIB_RECONN_HIGH_RACE` and
//! `kib_reconn_wait`, LU-5718, LU-7569).

use std::collections::VecDeque;
use std::time::Duration;

use lnet_shim::lnd::{LndError, PeerState};
use lnet_shim::nid::Nid;

use crate::time::Instant;

/// Reconnects after rejects that go at once before pacing starts (`KIB_RECONN_HIGH_RACE`).
pub(crate) const QUICK_RECONNECTS: u32 = 10;
/// Spacing of reconnects once paced (o2iblnd: the next second of the clock, `kib_reconn_wait`).
pub(crate) const RECONNECT_INTERVAL: Duration = Duration::from_secs(1);
/// Connection races tolerated before the lower NID is allowed to win (LU-7646).
pub(crate) const MAX_CONN_RACES: u32 = 20;

/// o2iblnd's NID hash for the connection-race tie-break: the network XOR the address as the raw
/// big-endian word LNet stores (read in host order).
pub(crate) fn nidhash(nid: Nid) -> u32 {
    let raw = nid.as_u64();
    ((raw >> 32) as u32) ^ (raw as u32).swap_bytes()
}

#[derive(Debug)]
pub(crate) struct Peer {
    pub(crate) nid: Nid,
    /// Connection keys (connecting, accepting, established, closing).
    pub(crate) conns: Vec<usize>,
    /// Transmits waiting for a connection.
    pub(crate) pending: VecDeque<usize>,
    /// Active connection attempts in flight.
    pub(crate) connecting: u32,
    /// Passive accepts in flight.
    pub(crate) accepting: u32,
    /// Round-robin cursor over established connections.
    pub(crate) rr: usize,
    /// The peer's incarnation as last seen (0 = unknown).
    pub(crate) incarnation: u64,
    /// Queue depth to ask for (reduced by QP sizing or MSG_QUEUE_SIZE rejects).
    pub(crate) queue_depth: u32,
    /// RDMA fragments to ask for (reduced by RDMA_FRAGS rejects).
    pub(crate) max_frags: u16,
    pub(crate) races: u32,
    /// Reconnects after rejects since a connection was last established or the last attempt
    /// failed for good (`ibp_reconnected`).
    pub(crate) reconnects: u32,
    /// A reconnect after a reject is due at this time (`ibp_reconnecting`): the transmits
    /// waiting for the peer wait for it.
    pub(crate) reconnect_at: Option<Instant>,
    /// Why the last attempt failed.
    pub(crate) last_error: Option<LndError>,
}

impl Peer {
    pub(crate) fn new(nid: Nid, queue_depth: u32) -> Peer {
        Peer {
            nid,
            conns: Vec::new(),
            pending: VecDeque::new(),
            connecting: 0,
            accepting: 0,
            rr: 0,
            incarnation: 0,
            queue_depth,
            max_frags: crate::wire::IBLND_MAX_RDMA_FRAGS as u16,
            races: 0,
            reconnects: 0,
            reconnect_at: None,
            last_error: None,
        }
    }

    /// Schedules one more reconnect after a reject and returns when it is due: the first
    /// [`QUICK_RECONNECTS`] at once, each later one [`RECONNECT_INTERVAL`] after the reject.
    pub(crate) fn schedule_reconnect(&mut self, now: Instant) -> Instant {
        self.reconnects = self.reconnects.saturating_add(1);
        let at = if self.reconnects > QUICK_RECONNECTS { now + RECONNECT_INTERVAL } else { now };
        self.reconnect_at = Some(at);
        at
    }

    /// The state reported to LNet.
    pub(crate) fn state(&self, established: usize) -> PeerState {
        if established > 0 {
            PeerState::Connected
        } else if self.connecting > 0 || self.accepting > 0 || self.reconnect_at.is_some() {
            PeerState::Connecting
        } else if self.last_error.is_some() {
            PeerState::Failed
        } else {
            PeerState::Idle
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nidhash_mixes_net_and_address() {
        let a: Nid = "10.0.0.1@o2ib".parse().unwrap();
        let b: Nid = "10.0.0.2@o2ib".parse().unwrap();
        assert_ne!(nidhash(a), nidhash(b));
        // net 0x50000 XOR the address bytes 0a 00 00 01 read little-endian (0x0100000a).
        assert_eq!(nidhash(a), 0x0005_0000 ^ 0x0100_000a);
    }

    #[test]
    fn reconnects_are_paced_after_ten() {
        let mut p = Peer::new("10.0.0.1@o2ib".parse().unwrap(), 8);
        let t = Instant::from_secs(5);
        for _ in 0..QUICK_RECONNECTS {
            assert_eq!(p.schedule_reconnect(t), t);
        }
        assert_eq!(p.schedule_reconnect(t), t + RECONNECT_INTERVAL);
        assert_eq!(p.reconnect_at, Some(t + RECONNECT_INTERVAL));
        assert_eq!(p.state(0), PeerState::Connecting, "a reconnect is due");
    }
}
