//! The LND interface: what LNet asks of a network driver, and what the driver tells LNet.
//!
//! This mirrors the kernel's `struct lnet_lnd` and the calls an LND makes back into LNet
//! (`lnet_parse`, `lnet_finalize`, `lnet_set_reply_msg_len`), reshaped for a poll-driven
//! userspace driver:
//! * LNet calls [`Lnd::send`] with an [`LndSend`]: the 72-byte LNet header, the payload
//!   fragments (PUT, REPLY) and, for a GET, where the reply's data must land. `send` fails only
//!   immediately; otherwise the LND reports the outcome **exactly once** through
//!   [`LndUpcalls::send_done`] with a [`SendStatus`] or an [`LndError`] carrying a health class.
//! * When a message arrives, the LND calls [`LndUpcalls::recv`] with its header. LNet matches it
//!   and answers at once with a [`RecvDisposition`]: drop it, a sink for its payload (PUT,
//!   IMMEDIATE), or the source of the reply data (a GET). The LND then moves the bytes (copy for
//!   IMMEDIATE, RDMA for PUT/GET) and reports the end of that receive with
//!   [`LndUpcalls::recv_done`], again exactly once. For an IMMEDIATE message, whose payload
//!   is in hand, [`LndUpcalls::recv_immediate`] does all three in one call (LNet: under one
//!   lock), as the kernel's `lnet_parse` calls the LND's `lnd_recv` before it returns.
//!
//! Upcalls run on the LND's scheduler threads: they must not block. They may call
//! [`Lnd::send`] (to send an ACK or a REPLY), which only queues.

use crate::event::Errno;
pub use crate::frags::{Frag, Frags, copy_to_frags, frags_len};
use crate::hdr::LnetHdr;
use crate::nid::Nid;

/// A message LNet asks the LND to send.
#[derive(Clone, Debug)]
pub struct LndSend {
    /// The peer on the LND's network that receives it (the next hop).
    pub target: Nid,
    /// The LNet header; its `payload_length` must equal the payload's size.
    pub hdr: LnetHdr,
    /// The payload of a PUT or REPLY (empty for GET and ACK).
    pub payload: Frags,
    /// For a GET: where the REPLY's data should land. With a sink the LND may move the reply by
    /// RDMA (GET_REQ/GET_DONE); without one the GET travels as a header-only message and the
    /// peer's LNet sends a REPLY message.
    pub get_sink: Option<Frags>,
    /// LNet's token for this send, returned in [`LndUpcalls::send_done`].
    pub token: u64,
}

/// How a send ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendStatus {
    /// For a GET whose reply moved by RDMA: the bytes the peer wrote into the sink.
    pub reply_len: Option<usize>,
}

/// LNet's health classes for a failed transmit (`enum lnet_msg_hstatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Health {
    /// A local resource or state problem.
    LocalError,
    /// Dropped locally (e.g. the connection was closed under it).
    LocalDropped,
    /// Aborted locally.
    LocalAborted,
    /// Timed out locally (no completion).
    LocalTimeout,
    /// The peer reported an error.
    RemoteError,
    /// The peer dropped it (connection closed by the peer, failed send completion).
    RemoteDropped,
    /// The peer did not answer in time.
    RemoteTimeout,
    /// The network did not deliver it in time (could not connect).
    NetworkTimeout,
}

/// A failed LND operation: an errno and LNet's health class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{errno} ({health:?})")]
pub struct LndError {
    /// The negative errno LNet would see.
    pub errno: Errno,
    /// Health class for LNet's health accounting.
    pub health: Health,
}

impl LndError {
    /// An error with an errno and a health class.
    pub const fn new(errno: Errno, health: Health) -> LndError {
        LndError { errno, health }
    }
}

/// LNet's answer to an incoming message.
#[derive(Clone, Debug)]
pub enum RecvDisposition {
    /// Nothing wants it (no match, or refused). The LND tells the peer (PUT_NAK, GET_DONE with
    /// `-ENODATA`) where the protocol allows and reports nothing more.
    Drop,
    /// PUT or IMMEDIATE: put the first `mlength` payload bytes into `frags`; report with
    /// [`LndUpcalls::recv_done`]`(token, ..)`.
    Sink {
        /// Where the bytes go (their total is at least `mlength`).
        frags: Frags,
        /// How many payload bytes to deliver (the rest are dropped: truncation).
        mlength: usize,
        /// LNet's token for this receive.
        token: u64,
    },
    /// An RDMA GET: send these bytes as the reply; report with [`LndUpcalls::recv_done`] once
    /// the reply has been sent.
    Source {
        /// The reply data.
        frags: Frags,
        /// LNet's token for this receive.
        token: u64,
    },
}

/// The calls an LND makes into LNet (implemented by LNet, or a test harness).
pub trait LndUpcalls: Send + Sync {
    /// A message from `from` with header `hdr` arrived (`lnet_parse`). `rdma` is true when its
    /// payload will move by RDMA (PUT_REQ, GET_REQ) rather than being in hand (IMMEDIATE).
    fn recv(&self, from: Nid, hdr: &LnetHdr, rdma: bool) -> RecvDisposition;

    /// A receive accepted with a `Sink` or `Source` finished: `Ok(bytes)` delivered (or sent,
    /// for a `Source`), or why not. Called exactly once per accepted receive.
    fn recv_done(&self, token: u64, result: Result<usize, LndError>);

    /// An IMMEDIATE message from `from` (its payload in hand, `payload`): what the kernel's
    /// `lnet_parse` does for one, with `lnd_recv` and `lnet_finalize` inside it. The default
    /// makes the three steps of that protocol: [`LndUpcalls::recv`], the copy of the first
    /// `mlength` payload bytes into the sink, [`LndUpcalls::recv_done`] (`Ok(0)` for a GET,
    /// which needs no sink: LNet answers it with a REPLY; `EINVAL` if the sink cannot hold
    /// the bytes; `EPROTO` if `payload` is shorter than the header's `payload_length`). LNet
    /// does them in one pass.
    fn recv_immediate(&self, from: Nid, hdr: &LnetHdr, payload: &[u8]) {
        match self.recv(from, hdr, false) {
            RecvDisposition::Drop => {}
            RecvDisposition::Sink { frags, mlength, token } => {
                self.recv_done(token, deliver_immediate(&frags, mlength, hdr.payload_length, payload));
            }
            RecvDisposition::Source { token, .. } => self.recv_done(token, Ok(0)),
        }
    }

    /// A send finished. Called exactly once per send that `Lnd::send` accepted.
    fn send_done(&self, token: u64, result: Result<SendStatus, LndError>);
}

/// An IMMEDIATE message's payload into the sink LNet gave for it: its first `mlength` bytes
/// (what [`LndUpcalls::recv_immediate`] reports through `recv_done`).
///
/// A payload shorter than the `payload_length` its LNet header announces is `-EPROTO` and
/// nothing is written, as o2iblnd's `kiblnd_recv` refuses it ("Immediate message too big"):
/// LNet's event reports the matched length, so accepting part of it would report bytes that
/// never arrived. Bytes past `payload_length` are ignored.
pub fn deliver_immediate(
    frags: &[Frag],
    mlength: usize,
    payload_length: u32,
    payload: &[u8],
) -> Result<usize, LndError> {
    if (payload.len() as u64) < u64::from(payload_length) {
        return Err(LndError::new(Errno::EPROTO, Health::RemoteError));
    }
    let data = payload.get(..mlength.min(payload.len())).unwrap_or_default();
    copy_to_frags(frags, data).ok_or(LndError::new(Errno::EINVAL, Health::LocalError))
}

/// Connection state of a peer, as reported by [`Lnd::peers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// No connection and none being made.
    Idle,
    /// Connecting.
    Connecting,
    /// At least one connection is established.
    Connected,
    /// The last connection attempt, or the last connection, failed (a peer that hung up, or
    /// a close on request, leaves it `Idle`); sends will trigger a new attempt (paced).
    Failed,
}

/// What an LND reports about one peer (`lnd_ctl` GET_PEER / GET_CONN).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer.
    pub nid: Nid,
    /// Its state.
    pub state: PeerState,
    /// Established connections.
    pub conns: usize,
    /// Negotiated queue depth of its first connection (0 if none).
    pub queue_depth: u16,
    /// Send credits available on its connections.
    pub credits: u32,
    /// Credits owed to the peer, not yet returned.
    pub outstanding_credits: u32,
    /// Lowest credits seen since the connection was established.
    pub min_credits: u32,
    /// Messages waiting for a connection or for credits.
    pub queued: usize,
    /// Messages posted and not yet completed.
    pub active: usize,
}

/// An LND: the network driver behind one LNet network interface.
pub trait Lnd: Send + Sync {
    /// The NID of this interface.
    fn nid(&self) -> Nid;

    /// Queues `msg` for sending. Fails only at once (e.g. shut down, bad fragments); otherwise
    /// the outcome arrives through [`LndUpcalls::send_done`].
    fn send(&self, msg: LndSend) -> Result<(), LndError>;

    /// Peers and their connections (`lnd_ctl` GET_PEER).
    fn peers(&self) -> Vec<PeerInfo>;

    /// Closes every connection to `peer` (`lnd_ctl` CLOSE_CONNECTION); pending sends fail.
    fn close_peer(&self, peer: Nid);

    /// Whether the interface cannot send at all for now: its port is down or its device
    /// failed (LNet's `ni_fatal_error_on`, which o2iblnd sets on `IB_EVENT_PORT_ERR` and
    /// `IB_EVENT_DEVICE_FATAL` and clears on `IB_EVENT_PORT_ACTIVE`). Reported in
    /// [`crate::lnet::NiStats::fatal_error`]. An LND with no such notion keeps the default.
    fn fatal_error(&self) -> bool {
        false
    }

    /// Stops the driver: every pending send and receive completes with an error, connections
    /// are closed. Idempotent.
    fn shutdown(&self);
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::buffer::Buffer;
    use crate::hdr::{LnetMsg, PutMsg, WireHandle};
    use crate::nid::ProcessId;

    /// Answers every `recv` with `answer` and records what `recv_done` was told.
    struct Fixed {
        answer: Mutex<Option<RecvDisposition>>,
        done: Mutex<Vec<(u64, Result<usize, LndError>)>>,
    }

    impl LndUpcalls for Fixed {
        fn recv(&self, _: Nid, _: &LnetHdr, rdma: bool) -> RecvDisposition {
            assert!(!rdma, "an IMMEDIATE is not an RDMA receive");
            self.answer.lock().unwrap().take().unwrap_or(RecvDisposition::Drop)
        }
        fn recv_done(&self, token: u64, result: Result<usize, LndError>) {
            self.done.lock().unwrap().push((token, result));
        }
        fn send_done(&self, _: u64, _: Result<SendStatus, LndError>) {}
    }

    fn run(answer: RecvDisposition, payload: &[u8]) -> Vec<(u64, Result<usize, LndError>)> {
        run_announcing(answer, payload.len() as u32, payload)
    }

    /// As [`run`], with a header announcing `payload_length` bytes.
    fn run_announcing(
        answer: RecvDisposition,
        payload_length: u32,
        payload: &[u8],
    ) -> Vec<(u64, Result<usize, LndError>)> {
        let nid: Nid = "10.0.0.1@o2ib".parse().unwrap();
        let hdr = LnetHdr {
            dest: ProcessId::new(nid, ProcessId::PID_LUSTRE),
            src: ProcessId::new(nid, ProcessId::PID_LUSTRE),
            payload_length,
            msg: LnetMsg::Put(PutMsg {
                ack_wmd: WireHandle::NONE,
                match_bits: 0,
                hdr_data: 0,
                ptl_index: 4,
                offset: 0,
            }),
        };
        let up = Fixed { answer: Mutex::new(Some(answer)), done: Mutex::new(Vec::new()) };
        up.recv_immediate(nid, &hdr, payload);
        up.done.into_inner().unwrap()
    }

    #[test]
    fn the_default_recv_immediate_matches_copies_mlength_bytes_and_finishes_once() {
        let sink = Arc::new(Buffer::new(8));
        let frags = Frags::from(Frag::whole(sink.clone()));
        // Truncated to mlength: 3 of the 5 bytes.
        assert_eq!(
            run(RecvDisposition::Sink { frags: frags.clone(), mlength: 3, token: 7 }, b"hello"),
            [(7, Ok(3))]
        );
        assert_eq!(sink.to_vec(0, 4).unwrap(), b"hel\0");
        // A sink too small for mlength: EINVAL, nothing written.
        let small = Frags::from(Frag { buf: sink.clone(), offset: 6, len: 2 });
        let einval = Err(LndError::new(Errno::EINVAL, Health::LocalError));
        assert_eq!(
            run(RecvDisposition::Sink { frags: small, mlength: 5, token: 8 }, b"world"),
            [(8, einval)]
        );
        assert_eq!(sink.to_vec(6, 2).unwrap(), b"\0\0");
        // A GET's source (LNet replies itself), and a drop (no recv_done at all).
        assert_eq!(run(RecvDisposition::Source { frags, token: 9 }, b""), [(9, Ok(0))]);
        assert_eq!(run(RecvDisposition::Drop, b"x"), []);
    }

    /// A payload shorter than its header announces fails the receive with `-EPROTO` and writes
    /// nothing (o2iblnd's `kiblnd_recv`: "Immediate message too big"), even when the sink
    /// would take only what did arrive; a longer one is fine (the rest is not looked at).
    #[test]
    fn the_default_recv_immediate_refuses_a_payload_shorter_than_announced() {
        let sink = Arc::new(Buffer::new(8));
        let frags = Frags::from(Frag::whole(sink.clone()));
        let eproto = Err(LndError::new(Errno::EPROTO, Health::RemoteError));
        let short = RecvDisposition::Sink { frags: frags.clone(), mlength: 3, token: 1 };
        assert_eq!(run_announcing(short, 6, b"hello"), [(1, eproto)]);
        assert_eq!(sink.to_vec(0, 8).unwrap(), [0; 8]);
        let long = RecvDisposition::Sink { frags, mlength: 3, token: 2 };
        assert_eq!(run_announcing(long, 4, b"hello"), [(2, Ok(3))]);
        assert_eq!(sink.to_vec(0, 4).unwrap(), b"hel\0");
    }
}
