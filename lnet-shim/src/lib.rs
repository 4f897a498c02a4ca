//! `lnet-shim`: the small LNet a userspace storage server links in.
//!
//! It mirrors the kernel's split between LNet and its network drivers (LNDs): this crate owns
//! NIDs, the LNet header, memory descriptors, match entries, events and LNet-level flow control;
//! an LND (the `lnd` crate's o2iblnd) plugs in behind the [`Lnd`] trait and moves the bytes.
//! [`Lnet`] is the entry point (see [`lnet`] for its contract); [`loopback`] is an in-process
//! LND for tests.
//!
//! `unsafe` is denied except in [`buffer`] and [`arena`], which own memory that devices write.
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
    AckReq, DROP_NAK_MLENGTH, DropCounts, Lnet, LnetConfig, LnetError, LnetStats, Md, MsgCounters,
    NetworkSpec, NetworksError, NiStats, NiStatus, PeerStats, parse_networks, resolve_nid,
};
pub use loopback::{LoopbackConfig, LoopbackError, LoopbackLnd, LoopbackNet};
pub use matching::{
    ANY_PROCESS, DEFAULT_PORTALS, DropReason, InsertPos, MatchEntry, MatchError, MatchOp, MatchResult,
    Matched, MdHandle, MdOptions, MdSpec, MdStatus, MeHandle, PortalTable, Threshold, Unlink, UnlinkedMd,
};
pub use nid::{Net, NetType, Nid, NidParseError, ProcessId};
