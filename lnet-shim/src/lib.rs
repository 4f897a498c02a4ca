//! `lnet-shim`: the small LNet a userspace storage server links in.
//!
//! It mirrors the kernel's split between LNet and its network drivers (LNDs): this crate owns
//! NIDs, the LNet header, memory descriptors, match entries, events and LNet-level flow control;
//! an LND (the `lnd` crate's o2iblnd) plugs in behind the [`Lnd`] trait and moves the bytes.
//! [`Lnet`] is the entry point (see [`lnet`] for its contract); [`loopback`] is an in-process
//! LND for tests.
//!
//! `unsafe` is denied except in [`buffer`] and [`arena`], which own memory that devices write.
//!
//! # Example
//!
//! Two nodes, a PUT with an ACK. Here the LND is the in-process [`LoopbackNet`]; a storage
//! server starts the o2iblnd instead (`lnd::driver::Driver::start` in the `add_ni` closure: the
//! `lnet_put` example of the `lnd` crate is this program over the software RDMA fabric).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use lnet_shim::matching::{MdOptions, Threshold, Unlink};
//! use lnet_shim::{
//!     ANY_PROCESS, AckReq, Buffer, EventKind, EventQueue, Lnd, LnetConfig, Lnet, LoopbackNet,
//!     MatchEntry, Md, Nid, ProcessId,
//! };
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let wire = LoopbackNet::new();
//! let node = |nid: Nid| -> Result<Lnet, Box<dyn std::error::Error>> {
//!     let lnet = Lnet::new(LnetConfig::default())?;
//!     // credits 256, peer_credits 8: ko2iblnd's defaults.
//!     lnet.add_ni(nid, 256, 8, |up| wire.start(nid, up).map(|l| l as Arc<dyn Lnd>))?;
//!     Ok(lnet)
//! };
//! let (a_nid, b_nid): (Nid, Nid) = ("10.0.0.1@o2ib".parse()?, "10.0.0.2@o2ib".parse()?);
//! let (a, b) = (node(a_nid)?, node(b_nid)?);
//! let wait = Duration::from_secs(5);
//!
//! // Target: 4 KiB on portal 8 for match bits 42, from anyone; its events go to `qb`.
//! let qb = EventQueue::new(64);
//! let sink = Arc::new(Buffer::new(4096));
//! let md = Md::contiguous(sink.clone()).with_options(MdOptions::OP_PUT).with_events(qb.clone());
//! b.attach(8, MatchEntry::new(ANY_PROCESS, 42), md, Unlink::Retain)?;
//!
//! // Initiator: PUT 4 KiB and ask for an ACK; the MD goes away after its two events.
//! let qa = EventQueue::new(64);
//! let data = Arc::new(Buffer::from_slice(&[7u8; 4096]));
//! let md = Md::contiguous(data).with_threshold(Threshold::Count(2)).with_events(qa.clone());
//! let h = a.md_bind(md, Unlink::Auto)?;
//! let target = ProcessId::new(b_nid, b.pid());
//! a.put(h, AckReq::Ack, target, 8, 42, /* remote offset */ 0, /* hdr_data */ 0)?;
//!
//! let put = qb.wait(wait).ok_or("no PUT event")?;
//! assert_eq!((put.kind, put.status, put.mlength), (EventKind::Put, Ok(()), 4096));
//! assert_eq!(sink.to_vec(0, 4096)?, vec![7u8; 4096]);
//! // The initiator sees SEND (its buffer may be reused), then the ACK, always in that order.
//! let kinds: Vec<EventKind> = [qa.wait(wait), qa.wait(wait)].into_iter().flatten().map(|e| e.kind).collect();
//! assert_eq!(kinds, [EventKind::Send, EventKind::Ack]);
//! a.shutdown();
//! b.shutdown();
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]

pub mod arena;
pub mod buffer;
pub mod event;
pub mod frags;
pub mod hash;
pub mod hdr;
pub mod lnd;
pub mod lnet;
pub mod loopback;
pub mod matching;
pub mod nid;

pub use buffer::{Buffer, OutOfRange, RegKeys};
pub use event::{Errno, Event, EventCallback, EventKind, EventQueue, EventSink};
pub use hdr::{
    AckMsg, GetMsg, HdrError, HelloMsg, LNET_HDR_SIZE, LnetHdr, LnetMsg, LnetMsgType, PutMsg, ReplyMsg,
    WireHandle,
};
pub use lnd::{
    Frag, Frags, Health, Lnd, LndError, LndSend, LndUpcalls, PeerInfo, PeerState, RecvDisposition,
    SendStatus, frags_len,
};
pub use lnet::{
    AckReq, DEFAULT_LAZY_MAX_BYTES, DEFAULT_TRANSACTION_TIMEOUT, DROP_NAK_MLENGTH, DropCounts, LazyStats,
    Lnet, LnetConfig, LnetError, LnetStats, MD_LENGTH_MAX, Md, MsgCounters, NetworkSpec, NetworksError,
    NiStats, NiStatus, PeerStats, parse_networks, resolve_nid,
};
pub use loopback::{LoopbackConfig, LoopbackError, LoopbackLnd, LoopbackNet};
pub use matching::{
    ANY_PROCESS, DEFAULT_PORTALS, DropReason, InsertPos, MatchEntry, MatchError, MatchOp, MatchResult,
    Matched, MdHandle, MdOptions, MdSpec, MdStatus, MeHandle, PORTALS_MAX, PortalTable, Threshold, Unlink,
    UnlinkedMd,
};
pub use nid::{Net, NetType, Nid, NidParseError, ProcessId};
