//! Statistics per NI and per peer (`lnetctl net show -v`, `lnetctl peer show -v`), readable as
//! data and printable.
//!
//! Credits follow LNet's convention: `credits_min` is the lowest value of *available credits
//! minus messages waiting*, so it goes negative when messages had to queue (the deepest queue
//! seen).

use std::fmt;

use super::State;
use super::ni::Ni;
use crate::lnd::{PeerInfo, PeerState};
use crate::nid::Nid;

/// The state of a network interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NiStatus {
    /// Its LND is being started.
    Starting,
    /// Running.
    Up,
    /// Its LND failed to start.
    Failed,
    /// Shut down.
    Down,
}

/// Message and byte counters (`struct lnet_element_stats` plus errors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgCounters {
    /// Messages handed to the LND (or delivered locally): PUT, GET, ACK, REPLY.
    pub send_count: u64,
    /// Payload bytes of those messages.
    pub send_bytes: u64,
    /// Sends that ended with an error.
    pub send_errors: u64,
    /// Incoming messages accepted (matched, or an expected ACK/REPLY).
    pub recv_count: u64,
    /// Payload bytes received into MDs.
    pub recv_bytes: u64,
    /// Accepted receives that then failed.
    pub recv_errors: u64,
    /// Incoming messages dropped.
    pub drop_count: u64,
    /// Payload bytes of dropped messages.
    pub drop_bytes: u64,
}

/// Why incoming messages were dropped, per NI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropCounts {
    /// No match entry on the portal accepted it.
    pub no_match: u64,
    /// An MD matched but the message did not fit and the MD does not truncate.
    pub too_long: u64,
    /// The portal index is out of range.
    pub bad_portal: u64,
    /// Not for this node or this pid.
    pub not_for_me: u64,
    /// Its LND peer is not its source (routing is not supported).
    pub routed: u64,
    /// An ACK or REPLY for no outstanding operation (unknown, unlinked or answered MD).
    pub unexpected: u64,
    /// A message type LNet does not take (HELLO).
    pub bad_type: u64,
    /// A PUT a lazy portal would have kept, but the bytes waiting there were at
    /// [`super::LnetConfig::lazy_max_bytes`].
    pub lazy_full: u64,
    /// A PUT that waited on a lazy portal, dropped when the portal was cleared or LNet shut
    /// down.
    pub lazy_discarded: u64,
}

impl DropCounts {
    /// All drops.
    pub fn total(&self) -> u64 {
        self.no_match
            + self.too_long
            + self.bad_portal
            + self.not_for_me
            + self.routed
            + self.unexpected
            + self.bad_type
            + self.lazy_full
            + self.lazy_discarded
    }
}

/// One peer on one NI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStats {
    /// The peer.
    pub nid: Nid,
    /// LNet's per-peer credits (the NI's `peer_credits`).
    pub credits_max: u32,
    /// Credits not in use.
    pub credits_available: u32,
    /// Low-water mark (negative: messages waited).
    pub credits_min: i64,
    /// Messages waiting for a peer credit.
    pub queued: usize,
    /// Traffic with this peer.
    pub counters: MsgCounters,
    /// The LND's view ([`crate::Lnd::peers`]): connection state, its own credits and queues.
    pub lnd: Option<PeerInfo>,
}

/// One network interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NiStats {
    /// The interface.
    pub nid: Nid,
    /// Its state.
    pub status: NiStatus,
    /// The LND reports that the interface cannot send for now (port down, device failed:
    /// [`crate::lnd::Lnd::fatal_error`], LNet's `ni_fatal_error_on`). Its sends fail at once.
    pub fatal_error: bool,
    /// LNet's NI credits.
    pub credits_max: u32,
    /// Credits not in use.
    pub credits_available: u32,
    /// Low-water mark (negative: messages waited).
    pub credits_min: i64,
    /// Messages waiting for an NI credit.
    pub queued: usize,
    /// LNet's per-peer credits on this NI.
    pub peer_credits: u32,
    /// All traffic on the NI.
    pub counters: MsgCounters,
    /// Drops by reason.
    pub drops: DropCounts,
    /// Peers, by NID.
    pub peers: Vec<PeerStats>,
}

impl NiStats {
    /// Attaches an LND's peer list to the peers (adding the ones LNet has not talked to).
    pub(super) fn merge_lnd_peers(&mut self, infos: Vec<PeerInfo>) {
        for info in infos {
            match self.peers.iter_mut().find(|p| p.nid == info.nid) {
                Some(p) => p.lnd = Some(info),
                None => self.peers.push(PeerStats {
                    nid: info.nid,
                    credits_max: self.peer_credits,
                    credits_available: self.peer_credits,
                    credits_min: i64::from(self.peer_credits),
                    queued: 0,
                    counters: MsgCounters::default(),
                    lnd: Some(info),
                }),
            }
        }
        self.peers.sort_by_key(|p| p.nid);
    }

    /// The peer `nid`, if LNet or the LND knows it.
    pub fn peer(&self, nid: Nid) -> Option<&PeerStats> {
        self.peers.iter().find(|p| p.nid == nid)
    }
}

/// A snapshot of an LNet's counters ([`super::Lnet::stats`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LnetStats {
    /// This process's pid.
    pub pid: u32,
    /// Interfaces, in the order they were added.
    pub nis: Vec<NiStats>,
    /// MDs alive (attached, bound, or unlinked but still in use).
    pub mds: usize,
    /// Messages LNet is working on (in an LND, waiting for credits, or being received).
    pub messages: usize,
    /// Lazy portals and the PUTs waiting on them.
    pub lazy: super::LazyStats,
    /// ACKs and REPLYs given up after the transaction timeout (their MDs unlinked, the
    /// responses ended with `-ETIMEDOUT`; the kernel's `response_timeout` count).
    pub response_timeouts: u64,
}

impl LnetStats {
    /// The interface `nid`.
    pub fn ni(&self, nid: Nid) -> Option<&NiStats> {
        self.nis.iter().find(|n| n.nid == nid)
    }
}

impl State {
    pub(super) fn stats(&self) -> LnetStats {
        LnetStats {
            pid: self.pid,
            nis: self.nis.iter().map(ni_stats).collect(),
            mds: self.mds.len(),
            messages: self.msgs.len(),
            lazy: self.lazy.stats(),
            response_timeouts: self.response_timeouts,
        }
    }
}

fn ni_stats(ni: &Ni) -> NiStats {
    let mut peers: Vec<PeerStats> = ni
        .peers
        .iter()
        .map(|(nid, p)| PeerStats {
            nid: *nid,
            credits_max: ni.peer_credits_max,
            credits_available: p.available,
            credits_min: p.min,
            queued: p.queue.len(),
            counters: p.counters,
            lnd: None,
        })
        .collect();
    peers.sort_by_key(|p| p.nid);
    NiStats {
        nid: ni.nid,
        status: ni.status,
        fatal_error: false,
        credits_max: ni.credits_max,
        credits_available: ni.available,
        credits_min: ni.min,
        queued: ni.queue.len(),
        peer_credits: ni.peer_credits_max,
        counters: ni.counters,
        drops: ni.drops,
        peers,
    }
}

impl fmt::Display for MsgCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent {} msgs {} B ({} failed), received {} msgs {} B ({} failed), dropped {} msgs {} B",
            self.send_count,
            self.send_bytes,
            self.send_errors,
            self.recv_count,
            self.recv_bytes,
            self.recv_errors,
            self.drop_count,
            self.drop_bytes
        )
    }
}

impl fmt::Display for DropCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no match {}, too long {}, bad portal {}, not for me {}, routed {}, unexpected {}, bad type {}, \
             lazy full {}, lazy discarded {}",
            self.no_match,
            self.too_long,
            self.bad_portal,
            self.not_for_me,
            self.routed,
            self.unexpected,
            self.bad_type,
            self.lazy_full,
            self.lazy_discarded
        )
    }
}

fn peer_state_name(s: PeerState) -> &'static str {
    match s {
        PeerState::Idle => "idle",
        PeerState::Connecting => "connecting",
        PeerState::Connected => "connected",
        PeerState::Failed => "failed",
    }
}

impl fmt::Display for PeerStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peer {}: credits {}/{} (min {}), queued {}; {}",
            self.nid, self.credits_available, self.credits_max, self.credits_min, self.queued, self.counters
        )?;
        if let Some(l) = &self.lnd {
            write!(
                f,
                "; lnd {} conns {} queue depth {} credits {} (min {}) outstanding {} queued {} active {}",
                peer_state_name(l.state),
                l.conns,
                l.queue_depth,
                l.credits,
                l.min_credits,
                l.outstanding_credits,
                l.queued,
                l.active
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for NiStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "ni {} {:?}{}: credits {}/{} (min {}), queued {}, peer credits {}",
            self.nid,
            self.status,
            if self.fatal_error { " (fatal error: port down or device failed)" } else { "" },
            self.credits_available,
            self.credits_max,
            self.credits_min,
            self.queued,
            self.peer_credits
        )?;
        writeln!(f, "  {}", self.counters)?;
        writeln!(f, "  drops: {}", self.drops)?;
        for p in &self.peers {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

impl fmt::Display for LnetStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lnet pid {}: {} MDs, {} messages in progress", self.pid, self.mds, self.messages)?;
        if self.response_timeouts > 0 {
            write!(f, ", {} responses timed out", self.response_timeouts)?;
        }
        writeln!(f)?;
        let l = &self.lazy;
        if l.portals > 0 || l.delayed > 0 {
            writeln!(
                f,
                "lazy portals {}: {} PUTs waiting ({} B), {} delayed, {} resumed",
                l.portals, l.waiting, l.waiting_bytes, l.delayed, l.resumed
            )?;
        }
        for ni in &self.nis {
            write!(f, "{ni}")?;
        }
        Ok(())
    }
}
