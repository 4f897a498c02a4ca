//! InfiniBand CM messages as 256-byte management datagrams (MADs), bit for bit.
//!
//! A CM MAD is the 24-byte MAD common header ([`MadHeader`]: base version 1, management class
//! 0x07, class version 2, method 0x03 Send) followed by 232 bytes of class data laid out per
//! IBTA Vol. 1 chapter 12 (Linux `ibta_vol1_c12.h`). This module turns the seven messages the
//! connection manager speaks ([`Req`], [`Rep`], [`Rtu`], [`Rej`], [`Mra`], [`Dreq`], [`Drep`])
//! into typed structs and back: [`CmMad::encode`] and [`CmMad::decode`].
//!
//! # Contract
//! * **No panics.** Decoding any byte string, of any length, returns `Ok` or a typed
//!   [`MadError`]; encoding any struct value returns `Ok` or a typed error. (A deterministic
//!   100k-buffer fuzz loop in the tests holds this up.)
//! * **Bit-exact layouts.** Every field sits at the byte and bit position of the IBTA tables;
//!   multi-byte fields are big-endian. Reserved bits and bytes are written as zero and ignored
//!   when read, so `decode(encode(m)) == m` for every encodable `m`, and `encode(decode(b))`
//!   equals `b` with its reserved bits (and the header's Status, ClassSpecific and
//!   AttributeModifier, which [`CmMad`] does not carry) cleared.
//! * **Widths are enforced, not truncated.** Sub-byte and 24-bit fields (QPNs, EECNs, PSNs,
//!   timeouts, retry counts, SL, flow label, packet rate, ...) are plain integers in the
//!   structs; a value that does not fit its field makes `encode` fail with
//!   [`MadError::FieldOutOfRange`] naming the field.
//! * **Enumerated fields are typed.** Transport service type, path MTU, "message REJected",
//!   "message MRAed" and "failover accepted" decode into enums; a code outside the enum is its
//!   own error (e.g. [`MadError::InvalidMtu`]). The REJ reason is an open enum
//!   ([`RejReason::Other`] keeps unknown codes) because a CM must report any reason it receives.
//! * **Header checks.** Decoding checks base version, class, class version and method (each its
//!   own error), then the attribute ID: ClassPortInfo, SIDR_REQ/SIDR_REP and LAP/APR are
//!   recognised and refused as [`MadError::Unsupported`]; anything else is
//!   [`MadError::UnknownAttribute`]. Status, class-specific and attribute-modifier fields are
//!   written as zero and not checked on receipt.
//! * **Transaction IDs** are carried, not interpreted: REQ and DREQ use [`cm_tid`]; REP, REJ,
//!   MRA, RTU and DREP copy the TID of the REQ/DREQ they answer. Receivers match comm IDs.
//!
//! # What Linux puts in a REQ on RoCE
//! rdma_cm over RoCEv2 fills the path part of a REQ from the IP route rather than from a subnet
//! manager: both port LIDs are 0xFFFF (permissive), the GIDs are the IPv4-mapped addresses
//! (`::ffff:a.b.c.d`, local = sender), the hop limit is the route's (64) so Subnet Local is 0,
//! flow label, traffic class, SL and packet rate are 0, P_Key is 0xFFFF, both CM response
//! timeouts are 20 (≈ 4.3 s), Max CM Retries is 15, Local Q_Key is 0 (RC), the Local ACK
//! Timeout is the packet lifetime + 1, and the private data starts with the 36-byte `cma_hdr`
//! (see [`super::ip_cm`]). [`Req::roce_defaults`] builds exactly that.
//!
//! # Timeouts
//! CM time fields are codes `t` meaning 4.096 µs × 2^t ([`cm_timeout`]). Linux's CM arms its
//! timers with the approximation 2^max(t−8, 0) ms ([`linux_cm_timeout`]); use that one for CM
//! retransmission and TIMEWAIT timers so a peer running Linux sees the timing it expects, and
//! the exact one where the code feeds hardware semantics (a QP's local ACK timeout) or is shown
//! to people.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::fabric::types::{Gid, Mad, Mtu};

/// Bytes in every MAD.
pub const MAD_LEN: usize = 256;
/// Bytes in the MAD common header.
pub const MAD_HEADER_LEN: usize = 24;
/// Bytes of class data after the header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// MAD base version (the only one defined).
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// CM class version: 2 (IBTA 1.2), the only version Linux's CM registers.
pub const CM_CLASS_VERSION: u8 = 2;
/// Method `Send`: every CM message uses it.
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs (the MAD header's AttributeID for each message).
pub mod attr {
    /// ClassPortInfo (recognised, unsupported).
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest.
    pub const REQ: u16 = 0x0010;
    /// Message Receipt Acknowledgement.
    pub const MRA: u16 = 0x0011;
    /// ConnectReject.
    pub const REJ: u16 = 0x0012;
    /// ConnectReply.
    pub const REP: u16 = 0x0013;
    /// ReadyToUse.
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest.
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply.
    pub const DREP: u16 = 0x0016;
    /// Service ID Resolution Request (recognised, unsupported).
    pub const SIDR_REQ: u16 = 0x0017;
    /// Service ID Resolution Response (recognised, unsupported).
    pub const SIDR_REP: u16 = 0x0018;
    /// Load Alternate Path (recognised, unsupported).
    pub const LAP: u16 = 0x0019;
    /// Alternate Path Response (recognised, unsupported).
    pub const APR: u16 = 0x001A;
}

/// Private-data bytes in a REQ.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private-data bytes in a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private-data bytes in an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Additional-reject-information bytes in a REJ.
pub const REJ_ARI_LEN: usize = 72;
/// Private-data bytes in a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Private-data bytes in an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private-data bytes in a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private-data bytes in a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;

/// CM response timeout code Linux's rdma_cm puts in both REQ timeout fields (≈ 4.3 s).
pub const ROCE_CM_RESPONSE_TIMEOUT: u8 = 20;
/// Max CM Retries Linux's rdma_cm asks for.
pub const ROCE_MAX_CM_RETRIES: u8 = 15;
/// Packet lifetime code rdma_cm assumes on RoCE (newer kernels; older ones use 18).
pub const ROCE_PACKET_LIFETIME: u8 = 16;
/// Local ACK timeout code in a RoCE REQ: packet lifetime + 1.
pub const ROCE_LOCAL_ACK_TIMEOUT: u8 = ROCE_PACKET_LIFETIME + 1;
/// Hop limit of a routed RoCEv2 path (the IP TTL).
pub const ROCE_HOP_LIMIT: u8 = 64;
/// The default (full-member) partition key.
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// The permissive LID RoCE puts in both LID fields of a routed path.
pub const PERMISSIVE_LID: u16 = 0xFFFF;

/// Offset of the CM class data inside the MAD.
const D: usize = MAD_HEADER_LEN;

/// Why a CM MAD could not be decoded or encoded, or an IP CM header not built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MadError {
    /// The buffer is shorter than the 256 bytes of a MAD (the length is carried).
    #[error("MAD truncated: {0} bytes, expected 256")]
    Truncated(usize),
    /// The buffer is longer than the 256 bytes of a MAD (the length is carried).
    #[error("MAD too long: {0} bytes, expected 256")]
    TooLong(usize),
    /// The MAD base version is not 1.
    #[error("bad MAD base version {0:#04x}, expected 0x01")]
    BadBaseVersion(u8),
    /// The management class is not the CM's (0x07).
    #[error("bad management class {0:#04x}, expected 0x07 (CM)")]
    BadMgmtClass(u8),
    /// The CM class version is not 2.
    #[error("bad CM class version {0}, expected 2")]
    BadClassVersion(u8),
    /// The method byte (R bit included) is not 0x03 Send.
    #[error("bad MAD method {0:#04x}, expected 0x03 (Send)")]
    BadMethod(u8),
    /// The attribute ID names no CM message.
    #[error("unknown CM attribute ID {0:#06x}")]
    UnknownAttribute(u16),
    /// A CM attribute this implementation does not handle: ClassPortInfo, SIDR_REQ, SIDR_REP,
    /// LAP or APR.
    #[error("unsupported CM attribute {0:#06x}")]
    Unsupported(u16),
    /// A REQ's transport service type is 2 (RD), which is not supported, or otherwise unknown.
    #[error("invalid transport service type {0}")]
    InvalidTransportType(u8),
    /// A REQ's path MTU code is not 1..=5.
    #[error("invalid path MTU code {0}")]
    InvalidMtu(u8),
    /// A REJ's "message REJected" code is 3 (reserved).
    #[error("invalid REJ message-rejected code {0}")]
    InvalidMessageRejected(u8),
    /// An MRA's "message MRAed" code is 3 (reserved).
    #[error("invalid MRA message-MRAed code {0}")]
    InvalidMessageMraed(u8),
    /// A REP's "failover accepted" code is 3 (reserved).
    #[error("invalid REP failover-accepted code {0}")]
    InvalidFailoverAccepted(u8),
    /// A REJ's reject-info length exceeds the 72 bytes of the ARI field.
    #[error("REJ reject info length {0} exceeds 72")]
    InvalidRejectInfoLength(u8),
    /// A field value does not fit the bits the layout gives it (encoding only).
    #[error("{field} = {value:#x} does not fit in {bits} bits")]
    FieldOutOfRange {
        /// The field, as named in the message struct.
        field: &'static str,
        /// The value that was given.
        value: u64,
        /// The field's width.
        bits: u8,
    },
    /// Consumer data for a REQ exceeds the 56 bytes left after the IP CM header.
    #[error("REQ consumer private data is {0} bytes, at most 56 fit after the IP CM header")]
    ConsumerDataTooLong(usize),
    /// An IP CM header was not exactly 36 bytes long.
    #[error("IP CM header is {0} bytes, expected 36")]
    CmaHeaderLength(usize),
    /// The IP CM header's version byte is not 0.
    #[error("unsupported IP CM header version {0:#04x}")]
    CmaVersion(u8),
    /// The IP CM header carries IPv6 addresses, which this implementation does not support.
    #[error("IP CM header carries IPv6 addresses (unsupported)")]
    CmaIpv6,
    /// The IP CM header's IP version nibble is neither 4 nor 6.
    #[error("invalid IP version {0} in IP CM header")]
    CmaIpVersion(u8),
}

/// The MAD common header (24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// BaseVersion (1).
    pub base_version: u8,
    /// MgmtClass (0x07 for the CM).
    pub mgmt_class: u8,
    /// ClassVersion (2 for the CM).
    pub class_version: u8,
    /// The R bit (0x80) and the method (0x03 Send for every CM message).
    pub method: u8,
    /// Status (0 in CM messages).
    pub status: u16,
    /// ClassSpecific (0 in CM messages).
    pub class_specific: u16,
    /// TransactionID.
    pub tid: u64,
    /// AttributeID: which message follows (see [`attr`]).
    pub attr_id: u16,
    /// AttributeModifier (0 in CM messages).
    pub attr_mod: u32,
}

impl MadHeader {
    /// The header of a CM Send with this TID and attribute ID.
    pub const fn cm(tid: u64, attr_id: u16) -> MadHeader {
        MadHeader {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod: 0,
        }
    }

    /// The header's 24 bytes (reserved bytes 18–19 zero).
    pub fn encode(&self) -> [u8; MAD_HEADER_LEN] {
        let mut out = [0u8; MAD_HEADER_LEN];
        let mut w = Wr(&mut out);
        w.u8(0, self.base_version);
        w.u8(1, self.mgmt_class);
        w.u8(2, self.class_version);
        w.u8(3, self.method);
        w.u16(4, self.status);
        w.u16(6, self.class_specific);
        w.u64(8, self.tid);
        w.u16(16, self.attr_id);
        w.u32(20, self.attr_mod);
        out
    }

    /// Parses the first 24 bytes of `bytes` and checks that they head a CM Send: base version
    /// 1, class 0x07, class version 2, method 0x03, in that order, each failure its own error.
    /// The attribute ID is not checked here.
    pub fn decode(bytes: &[u8]) -> Result<MadHeader, MadError> {
        if bytes.len() < MAD_HEADER_LEN {
            return Err(MadError::Truncated(bytes.len()));
        }
        let r = Rd(bytes);
        let h = MadHeader {
            base_version: r.u8(0),
            mgmt_class: r.u8(1),
            class_version: r.u8(2),
            method: r.u8(3),
            status: r.u16(4),
            class_specific: r.u16(6),
            tid: r.u64(8),
            attr_id: r.u16(16),
            attr_mod: r.u32(20),
        };
        if h.base_version != BASE_VERSION {
            return Err(MadError::BadBaseVersion(h.base_version));
        }
        if h.mgmt_class != MGMT_CLASS_CM {
            return Err(MadError::BadMgmtClass(h.mgmt_class));
        }
        if h.class_version != CM_CLASS_VERSION {
            return Err(MadError::BadClassVersion(h.class_version));
        }
        if h.method != METHOD_SEND {
            return Err(MadError::BadMethod(h.method));
        }
        Ok(h)
    }
}

/// The transaction ID Linux gives a REQ or DREQ: the MAD agent's high 32 bits, then the local
/// comm ID. Answers (REP, REJ, MRA, RTU, DREP) copy the TID of the message they answer.
pub const fn cm_tid(hi: u32, local_comm_id: u32) -> u64 {
    ((hi as u64) << 32) | local_comm_id as u64
}

/// The exact meaning of a CM/IBA time code `t`: 4.096 µs × 2^t.
///
/// Use it where the code has hardware semantics (a QP's local ACK timeout) or for display.
/// Codes are 5-bit; larger values are treated as 31.
pub fn cm_timeout(code: u8) -> Duration {
    let t = u32::from(code.min(31));
    Duration::from_nanos(4096u64 << t)
}

/// Linux's approximation of a time code `t`: 2^max(t−8, 0) ms (`cm_convert_to_ms`; t = 20 →
/// 4096 ms).
///
/// Use it for CM retransmission timers (REQ, REP, DREQ, MRA service timeout) and TIMEWAIT, so
/// the handshake times out when a Linux peer expects it to. Codes are 5-bit; larger values are
/// treated as 31.
pub fn linux_cm_timeout(code: u8) -> Duration {
    let t = u32::from(code.min(31));
    Duration::from_millis(1u64 << t.saturating_sub(8))
}

/// REQ transport service type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TransportType {
    /// Reliable connected (code 0).
    #[default]
    Rc,
    /// Unreliable connected (code 1).
    Uc,
    /// Extended reliable connected (code 3, as Linux encodes XRC).
    Xrc,
}

impl TransportType {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            TransportType::Rc => 0,
            TransportType::Uc => 1,
            TransportType::Xrc => 3,
        }
    }

    /// The type of a code; `None` for 2 (RD, unsupported) and anything wider than 2 bits.
    pub const fn from_code(code: u8) -> Option<TransportType> {
        match code {
            0 => Some(TransportType::Rc),
            1 => Some(TransportType::Uc),
            3 => Some(TransportType::Xrc),
            _ => None,
        }
    }
}

/// Which message a REJ rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MessageRejected {
    /// A REQ (code 0).
    #[default]
    Req,
    /// A REP (code 1).
    Rep,
    /// Some other message (code 2).
    Other,
}

impl MessageRejected {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            MessageRejected::Req => 0,
            MessageRejected::Rep => 1,
            MessageRejected::Other => 2,
        }
    }

    /// The value of a code; `None` for 3 (reserved) and wider values.
    pub const fn from_code(code: u8) -> Option<MessageRejected> {
        match code {
            0 => Some(MessageRejected::Req),
            1 => Some(MessageRejected::Rep),
            2 => Some(MessageRejected::Other),
            _ => None,
        }
    }
}

/// Which message an MRA acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MessageMraed {
    /// A REQ (code 0).
    #[default]
    Req,
    /// A REP (code 1).
    Rep,
    /// A LAP (code 2).
    Lap,
}

impl MessageMraed {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            MessageMraed::Req => 0,
            MessageMraed::Rep => 1,
            MessageMraed::Lap => 2,
        }
    }

    /// The value of a code; `None` for 3 (reserved) and wider values.
    pub const fn from_code(code: u8) -> Option<MessageMraed> {
        match code {
            0 => Some(MessageMraed::Req),
            1 => Some(MessageMraed::Rep),
            2 => Some(MessageMraed::Lap),
            _ => None,
        }
    }
}

/// A REP's answer to the REQ's alternate path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailoverAccepted {
    /// Failover accepted (code 0; also what is sent when there is no alternate path).
    #[default]
    Accepted,
    /// Failover not supported (code 1).
    NotSupported,
    /// Failover rejected (code 2).
    Rejected,
}

impl FailoverAccepted {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            FailoverAccepted::Accepted => 0,
            FailoverAccepted::NotSupported => 1,
            FailoverAccepted::Rejected => 2,
        }
    }

    /// The value of a code; `None` for 3 (reserved) and wider values.
    pub const fn from_code(code: u8) -> Option<FailoverAccepted> {
        match code {
            0 => Some(FailoverAccepted::Accepted),
            1 => Some(FailoverAccepted::NotSupported),
            2 => Some(FailoverAccepted::Rejected),
            _ => None,
        }
    }
}

/// Why a REJ rejects (IBTA Vol. 1 "Reject Reason"; Linux `enum ib_cm_rej_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 2: no EE context available.
    NoEec,
    /// 3: no resources available.
    NoResources,
    /// 4: timeout (ARI = the sender's CA GUID).
    Timeout,
    /// 5: unsupported request.
    Unsupported,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: invalid service ID (no listener).
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection.
    StaleConn,
    /// 11: RDC does not exist.
    RdcNotExist,
    /// 12: primary remote port GID rejected (ARI = the rejecter's GID).
    InvalidGid,
    /// 13: primary remote port LID rejected.
    InvalidLid,
    /// 14: invalid primary SL.
    InvalidSl,
    /// 15: invalid primary traffic class.
    InvalidTrafficClass,
    /// 16: invalid primary hop limit.
    InvalidHopLimit,
    /// 17: invalid primary packet rate.
    InvalidPacketRate,
    /// 18: alternate remote port GID rejected.
    InvalidAltGid,
    /// 19: alternate remote port LID rejected.
    InvalidAltLid,
    /// 20: invalid alternate SL.
    InvalidAltSl,
    /// 21: invalid alternate traffic class.
    InvalidAltTrafficClass,
    /// 22: invalid alternate hop limit.
    InvalidAltHopLimit,
    /// 23: invalid alternate packet rate.
    InvalidAltPacketRate,
    /// 24: port and CM redirection.
    PortCmRedirect,
    /// 25: port redirection.
    PortRedirect,
    /// 26: invalid path MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientRespResources,
    /// 28: consumer reject (the only reason that carries consumer private data).
    ConsumerDefined,
    /// 29: invalid RNR NAK retry count.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: invalid class version.
    InvalidClassVersion,
    /// 32: invalid primary flow label.
    InvalidFlowLabel,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel,
    /// 35: vendor option not supported.
    VendorOptionNotSupported,
    /// Any other code (0, 34, 36 and above): kept as received.
    Other(u16),
}

impl RejReason {
    /// The reason of a wire code.
    pub const fn from_u16(code: u16) -> RejReason {
        match code {
            1 => RejReason::NoQp,
            2 => RejReason::NoEec,
            3 => RejReason::NoResources,
            4 => RejReason::Timeout,
            5 => RejReason::Unsupported,
            6 => RejReason::InvalidCommId,
            7 => RejReason::InvalidCommInstance,
            8 => RejReason::InvalidServiceId,
            9 => RejReason::InvalidTransportType,
            10 => RejReason::StaleConn,
            11 => RejReason::RdcNotExist,
            12 => RejReason::InvalidGid,
            13 => RejReason::InvalidLid,
            14 => RejReason::InvalidSl,
            15 => RejReason::InvalidTrafficClass,
            16 => RejReason::InvalidHopLimit,
            17 => RejReason::InvalidPacketRate,
            18 => RejReason::InvalidAltGid,
            19 => RejReason::InvalidAltLid,
            20 => RejReason::InvalidAltSl,
            21 => RejReason::InvalidAltTrafficClass,
            22 => RejReason::InvalidAltHopLimit,
            23 => RejReason::InvalidAltPacketRate,
            24 => RejReason::PortCmRedirect,
            25 => RejReason::PortRedirect,
            26 => RejReason::InvalidMtu,
            27 => RejReason::InsufficientRespResources,
            28 => RejReason::ConsumerDefined,
            29 => RejReason::InvalidRnrRetry,
            30 => RejReason::DuplicateLocalCommId,
            31 => RejReason::InvalidClassVersion,
            32 => RejReason::InvalidFlowLabel,
            33 => RejReason::InvalidAltFlowLabel,
            35 => RejReason::VendorOptionNotSupported,
            other => RejReason::Other(other),
        }
    }

    /// The wire code. `Other(c)` gives `c` back even if `c` is a named reason's code.
    pub const fn to_u16(self) -> u16 {
        match self {
            RejReason::NoQp => 1,
            RejReason::NoEec => 2,
            RejReason::NoResources => 3,
            RejReason::Timeout => 4,
            RejReason::Unsupported => 5,
            RejReason::InvalidCommId => 6,
            RejReason::InvalidCommInstance => 7,
            RejReason::InvalidServiceId => 8,
            RejReason::InvalidTransportType => 9,
            RejReason::StaleConn => 10,
            RejReason::RdcNotExist => 11,
            RejReason::InvalidGid => 12,
            RejReason::InvalidLid => 13,
            RejReason::InvalidSl => 14,
            RejReason::InvalidTrafficClass => 15,
            RejReason::InvalidHopLimit => 16,
            RejReason::InvalidPacketRate => 17,
            RejReason::InvalidAltGid => 18,
            RejReason::InvalidAltLid => 19,
            RejReason::InvalidAltSl => 20,
            RejReason::InvalidAltTrafficClass => 21,
            RejReason::InvalidAltHopLimit => 22,
            RejReason::InvalidAltPacketRate => 23,
            RejReason::PortCmRedirect => 24,
            RejReason::PortRedirect => 25,
            RejReason::InvalidMtu => 26,
            RejReason::InsufficientRespResources => 27,
            RejReason::ConsumerDefined => 28,
            RejReason::InvalidRnrRetry => 29,
            RejReason::DuplicateLocalCommId => 30,
            RejReason::InvalidClassVersion => 31,
            RejReason::InvalidFlowLabel => 32,
            RejReason::InvalidAltFlowLabel => 33,
            RejReason::VendorOptionNotSupported => 35,
            RejReason::Other(code) => code,
        }
    }

    /// The IBTA wording of the reason; `None` for [`RejReason::Other`].
    pub const fn ibta_name(self) -> Option<&'static str> {
        Some(match self {
            RejReason::NoQp => "No QP available",
            RejReason::NoEec => "No EEC available",
            RejReason::NoResources => "No resources available",
            RejReason::Timeout => "Timeout",
            RejReason::Unsupported => "Unsupported request",
            RejReason::InvalidCommId => "Invalid Communication ID",
            RejReason::InvalidCommInstance => "Invalid Communication Instance",
            RejReason::InvalidServiceId => "Invalid Service ID",
            RejReason::InvalidTransportType => "Invalid Transport Service Type",
            RejReason::StaleConn => "Stale connection",
            RejReason::RdcNotExist => "RDC does not exist",
            RejReason::InvalidGid => "Primary Remote Port GID rejected",
            RejReason::InvalidLid => "Primary Remote Port LID rejected",
            RejReason::InvalidSl => "Invalid Primary SL",
            RejReason::InvalidTrafficClass => "Invalid Primary Traffic Class",
            RejReason::InvalidHopLimit => "Invalid Primary Hop Limit",
            RejReason::InvalidPacketRate => "Invalid Primary Packet Rate",
            RejReason::InvalidAltGid => "Alternate Remote Port GID rejected",
            RejReason::InvalidAltLid => "Alternate Remote Port LID rejected",
            RejReason::InvalidAltSl => "Invalid Alternate SL",
            RejReason::InvalidAltTrafficClass => "Invalid Alternate Traffic Class",
            RejReason::InvalidAltHopLimit => "Invalid Alternate Hop Limit",
            RejReason::InvalidAltPacketRate => "Invalid Alternate Packet Rate",
            RejReason::PortCmRedirect => "Port and CM Redirection",
            RejReason::PortRedirect => "Port Redirection",
            RejReason::InvalidMtu => "Invalid Path MTU",
            RejReason::InsufficientRespResources => "Insufficient Responder Resources",
            RejReason::ConsumerDefined => "Consumer Reject",
            RejReason::InvalidRnrRetry => "Invalid RNR NAK Retry Count",
            RejReason::DuplicateLocalCommId => "Duplicate Local Communication ID",
            RejReason::InvalidClassVersion => "Invalid Class Version",
            RejReason::InvalidFlowLabel => "Invalid Primary Flow Label",
            RejReason::InvalidAltFlowLabel => "Invalid Alternate Flow Label",
            RejReason::VendorOptionNotSupported => "Vendor Option Not Supported",
            RejReason::Other(_) => return None,
        })
    }
}

impl From<u16> for RejReason {
    fn from(code: u16) -> RejReason {
        RejReason::from_u16(code)
    }
}

impl From<RejReason> for u16 {
    fn from(r: RejReason) -> u16 {
        r.to_u16()
    }
}

impl fmt::Display for RejReason {
    /// The IBTA wording and the code, e.g. `Consumer Reject (28)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ibta_name() {
            Some(name) => write!(f, "{name} ({})", self.to_u16()),
            None => write!(f, "Unknown reject reason ({})", self.to_u16()),
        }
    }
}

/// One path of a REQ (primary or alternate): the fields of a path record the CM carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRecord {
    /// Local port LID (0xFFFF, permissive, on routed RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (the sender's).
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate code (6 bits; 0 = the port's current rate).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Whether the remote port is on the local subnet.
    pub subnet_local: bool,
    /// Local ACK timeout code (5 bits).
    pub local_ack_timeout: u8,
}

/// Bytes a path occupies in a REQ.
const PATH_LEN: usize = 44;

impl PathRecord {
    /// A RoCEv2 path between two IPv4 addresses as rdma_cm fills it: IPv4-mapped GIDs; with
    /// `hop_limit` > 1 (a routed path) LIDs 0xFFFF and Subnet Local 0, otherwise LIDs 0 and
    /// Subnet Local 1; flow label, traffic class, SL and packet rate 0; Local ACK Timeout
    /// [`ROCE_LOCAL_ACK_TIMEOUT`].
    pub const fn roce(local: Ipv4Addr, remote: Ipv4Addr, hop_limit: u8) -> PathRecord {
        let routed = hop_limit > 1;
        let lid = if routed { PERMISSIVE_LID } else { 0 };
        PathRecord {
            local_lid: lid,
            remote_lid: lid,
            local_gid: Gid::from_ipv4(local),
            remote_gid: Gid::from_ipv4(remote),
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit,
            sl: 0,
            subnet_local: !routed,
            local_ack_timeout: ROCE_LOCAL_ACK_TIMEOUT,
        }
    }

    /// The 44 bytes of this path; `alt` picks the field names used in errors.
    fn encode(&self, alt: bool) -> Result<[u8; PATH_LEN], MadError> {
        let name = |p: &'static str, a: &'static str| if alt { a } else { p };
        let flow = fit(name("primary_path.flow_label", "alternate_path.flow_label"), self.flow_label, 20)?;
        let rate = fit8(name("primary_path.packet_rate", "alternate_path.packet_rate"), self.packet_rate, 6)?;
        let sl = fit8(name("primary_path.sl", "alternate_path.sl"), self.sl, 4)?;
        let ack = fit8(
            name("primary_path.local_ack_timeout", "alternate_path.local_ack_timeout"),
            self.local_ack_timeout,
            5,
        )?;
        let mut out = [0u8; PATH_LEN];
        let mut w = Wr(&mut out);
        w.u16(0, self.local_lid);
        w.u16(2, self.remote_lid);
        w.bytes(4, &self.local_gid.0);
        w.bytes(20, &self.remote_gid.0);
        w.u32(36, (flow << 12) | u32::from(rate));
        w.u8(40, self.traffic_class);
        w.u8(41, self.hop_limit);
        w.u8(42, (sl << 4) | (u8::from(self.subnet_local) << 3));
        w.u8(43, ack << 3);
        Ok(out)
    }

    /// The path in the 44 bytes at `off` of `r`; reserved bits are ignored.
    fn decode(r: &Rd<'_>, off: usize) -> PathRecord {
        PathRecord {
            local_lid: r.u16(off),
            remote_lid: r.u16(off + 2),
            local_gid: Gid(r.array(off + 4)),
            remote_gid: Gid(r.array(off + 20)),
            flow_label: r.u32(off + 36) >> 12,
            packet_rate: r.u8(off + 39) & 0x3F,
            traffic_class: r.u8(off + 40),
            hop_limit: r.u8(off + 41),
            sl: r.u8(off + 42) >> 4,
            subnet_local: (r.u8(off + 42) >> 3) & 1 == 1,
            local_ack_timeout: r.u8(off + 43) >> 3,
        }
    }

    /// Whether every field is zero (how a REQ says "no alternate path").
    pub fn is_zero(&self) -> bool {
        *self == PathRecord::default()
    }
}

/// ConnectRequest (attribute 0x0010).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// Local Comm ID (nonzero, unique per live connection of the sender).
    pub local_comm_id: u32,
    /// Service ID (for rdma_cm, see [`super::ip_cm::ip_service_id`]).
    pub service_id: u64,
    /// Local CA GUID (the sender's node GUID).
    pub local_ca_guid: u64,
    /// Local Q_Key (0 for RC).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources: RDMA READ/atomic depth the sender accepts as responder.
    pub responder_resources: u8,
    /// Local EECN (24 bits; 0 unless RD).
    pub local_eecn: u32,
    /// Initiator depth: RDMA READ/atomic the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits; 0 unless RD).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout code (5 bits): how long the sender waits for a REP.
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport_type: TransportType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits): where the *receiver* of this REQ starts sending.
    pub starting_psn: u32,
    /// Local CM Response Timeout code (5 bits): how long the sender takes to answer.
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDC exists (RD only).
    pub rdc_exists: bool,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses a shared receive queue.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary_path: PathRecord,
    /// The alternate path; `None` is sent as 44 zero bytes, and a zero path decodes as `None`.
    pub alternate_path: Option<PathRecord>,
    /// SAP supported (bit 2 of byte 139, next to the alternate path's ACK timeout).
    pub sap_supported: bool,
    /// Private data (for rdma_cm: the IP CM header, then consumer data).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Default for Req {
    /// All fields zero (RC, 4096-byte MTU, no alternate path).
    fn default() -> Req {
        Req {
            local_comm_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: 0,
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_type: TransportType::Rc,
            end_to_end_flow_control: false,
            starting_psn: 0,
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: 0,
            path_mtu: Mtu::default(),
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport_type: 0,
            primary_path: PathRecord::default(),
            alternate_path: None,
            sap_supported: false,
            private_data: [0; REQ_PRIVATE_DATA_LEN],
        }
    }
}

/// What the caller chooses in a RoCE REQ; [`Req::roce_defaults`] fills the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceReqParams {
    /// Local Comm ID (nonzero).
    pub local_comm_id: u32,
    /// Service ID (`ip_service_id(PortSpace::Tcp, port)` for rdma_cm).
    pub service_id: u64,
    /// The sender's node GUID (rxe: the EUI-64 of the MAC).
    pub local_ca_guid: u64,
    /// The sender's QP number (24 bits).
    pub local_qpn: u32,
    /// Random 24-bit PSN at which the passive side will start sending.
    pub starting_psn: u32,
    /// The sender's IPv4 address.
    pub local_ip: Ipv4Addr,
    /// The receiver's IPv4 address.
    pub remote_ip: Ipv4Addr,
    /// Path MTU (netdev MTU − 96 rounded down: 1500 → 1024, 9000 → 4096).
    pub path_mtu: Mtu,
    /// Responder resources (o2iblnd: 0, no RDMA READ).
    pub responder_resources: u8,
    /// Initiator depth (o2iblnd: 0).
    pub initiator_depth: u8,
    /// End-to-end flow control (o2iblnd sets it).
    pub flow_control: bool,
    /// Transport retry count (≤ 7).
    pub retry_count: u8,
    /// RNR retry count (≤ 7, 7 = infinite).
    pub rnr_retry_count: u8,
    /// Private data (`super::ip_cm::req_private_data`).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Req {
    /// A REQ as Linux rdma_cm sends it on RoCEv2 ("REQ on RoCE"): RC, Q_Key 0, P_Key 0xFFFF,
    /// both CM response timeouts [`ROCE_CM_RESPONSE_TIMEOUT`] (20), Max CM Retries 15, no RDC,
    /// no SRQ, no extended transport, primary path [`PathRecord::roce`] with hop limit 64
    /// (LIDs 0xFFFF, Subnet Local 0, ACK timeout 17), no alternate path, SAP not supported.
    ///
    /// Out-of-range values in `p` (a QPN over 24 bits, a retry count over 7) are kept as given
    /// and make [`CmMad::encode`] fail.
    pub fn roce_defaults(p: RoceReqParams) -> Req {
        Req {
            local_comm_id: p.local_comm_id,
            service_id: p.service_id,
            local_ca_guid: p.local_ca_guid,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: ROCE_CM_RESPONSE_TIMEOUT,
            transport_type: TransportType::Rc,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: ROCE_CM_RESPONSE_TIMEOUT,
            retry_count: p.retry_count,
            pkey: DEFAULT_PKEY,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: ROCE_MAX_CM_RETRIES,
            srq: false,
            extended_transport_type: 0,
            primary_path: PathRecord::roce(p.local_ip, p.remote_ip, ROCE_HOP_LIMIT),
            alternate_path: None,
            sap_supported: false,
            private_data: p.private_data,
        }
    }

    fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let qpn = fit("local_qpn", self.local_qpn, 24)?;
        let leecn = fit("local_eecn", self.local_eecn, 24)?;
        let reecn = fit("remote_eecn", self.remote_eecn, 24)?;
        let rcrt = fit8("remote_cm_response_timeout", self.remote_cm_response_timeout, 5)?;
        let psn = fit("starting_psn", self.starting_psn, 24)?;
        let lcrt = fit8("local_cm_response_timeout", self.local_cm_response_timeout, 5)?;
        let retry = fit8("retry_count", self.retry_count, 3)?;
        let rnr = fit8("rnr_retry_count", self.rnr_retry_count, 3)?;
        let cm_retries = fit8("max_cm_retries", self.max_cm_retries, 4)?;
        let ext = fit8("extended_transport_type", self.extended_transport_type, 3)?;
        let primary = self.primary_path.encode(false)?;
        let mut alternate = match &self.alternate_path {
            Some(path) => path.encode(true)?,
            None => [0u8; PATH_LEN],
        };
        if let Some(last) = alternate.last_mut() {
            *last |= u8::from(self.sap_supported) << 2;
        }

        w.u32(D, self.local_comm_id);
        w.u64(D + 8, self.service_id);
        w.u64(D + 16, self.local_ca_guid);
        w.u32(D + 28, self.local_qkey);
        w.u32(D + 32, (qpn << 8) | u32::from(self.responder_resources));
        w.u32(D + 36, (leecn << 8) | u32::from(self.initiator_depth));
        let b43 = (rcrt << 3) | (self.transport_type.code() << 1) | u8::from(self.end_to_end_flow_control);
        w.u32(D + 40, (reecn << 8) | u32::from(b43));
        w.u32(D + 44, (psn << 8) | u32::from((lcrt << 3) | retry));
        w.u16(D + 48, self.pkey);
        w.u8(D + 50, (self.path_mtu.code() << 4) | (u8::from(self.rdc_exists) << 3) | rnr);
        w.u8(D + 51, (cm_retries << 4) | (u8::from(self.srq) << 3) | ext);
        w.bytes(D + 52, &primary);
        w.bytes(D + 96, &alternate);
        w.bytes(D + 140, &self.private_data);
        Ok(())
    }

    fn decode_from(r: &Rd<'_>) -> Result<Req, MadError> {
        let tt = (r.u8(D + 43) >> 1) & 3;
        let transport_type = TransportType::from_code(tt).ok_or(MadError::InvalidTransportType(tt))?;
        let mtu_code = r.u8(D + 50) >> 4;
        let path_mtu = Mtu::from_code(mtu_code).ok_or(MadError::InvalidMtu(mtu_code))?;
        let alternate = PathRecord::decode(r, D + 96);
        Ok(Req {
            local_comm_id: r.u32(D),
            service_id: r.u64(D + 8),
            local_ca_guid: r.u64(D + 16),
            local_qkey: r.u32(D + 28),
            local_qpn: r.u32(D + 32) >> 8,
            responder_resources: r.u8(D + 35),
            local_eecn: r.u32(D + 36) >> 8,
            initiator_depth: r.u8(D + 39),
            remote_eecn: r.u32(D + 40) >> 8,
            remote_cm_response_timeout: r.u8(D + 43) >> 3,
            transport_type,
            end_to_end_flow_control: r.u8(D + 43) & 1 == 1,
            starting_psn: r.u32(D + 44) >> 8,
            local_cm_response_timeout: r.u8(D + 47) >> 3,
            retry_count: r.u8(D + 47) & 7,
            pkey: r.u16(D + 48),
            path_mtu,
            rdc_exists: (r.u8(D + 50) >> 3) & 1 == 1,
            rnr_retry_count: r.u8(D + 50) & 7,
            max_cm_retries: r.u8(D + 51) >> 4,
            srq: (r.u8(D + 51) >> 3) & 1 == 1,
            extended_transport_type: r.u8(D + 51) & 7,
            primary_path: PathRecord::decode(r, D + 52),
            alternate_path: if alternate.is_zero() { None } else { Some(alternate) },
            sap_supported: (r.u8(D + 139) >> 2) & 1 == 1,
            private_data: r.array(D + 140),
        })
    }
}

/// ConnectReply (attribute 0x0013).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// Local Comm ID (the replier's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the REQ's Local Comm ID).
    pub remote_comm_id: u32,
    /// Local Q_Key (0 for RC).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits; 0 unless RD).
    pub local_eecn: u32,
    /// Starting PSN (24 bits): where the REQ's sender starts sending.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay code (5 bits).
    pub target_ack_delay: u8,
    /// Whether the alternate path was accepted.
    pub failover_accepted: FailoverAccepted,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The replier's QP uses a shared receive queue.
    pub srq: bool,
    /// Local CA GUID (the replier's node GUID).
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl Default for Rep {
    /// All fields zero.
    fn default() -> Rep {
        Rep {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: 0,
            local_qpn: 0,
            local_eecn: 0,
            starting_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: FailoverAccepted::Accepted,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; REP_PRIVATE_DATA_LEN],
        }
    }
}

impl Rep {
    fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let qpn = fit("local_qpn", self.local_qpn, 24)?;
        let eecn = fit("local_eecn", self.local_eecn, 24)?;
        let psn = fit("starting_psn", self.starting_psn, 24)?;
        let delay = fit8("target_ack_delay", self.target_ack_delay, 5)?;
        let rnr = fit8("rnr_retry_count", self.rnr_retry_count, 3)?;
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u32(D + 8, self.local_qkey);
        w.u32(D + 12, qpn << 8);
        w.u32(D + 16, eecn << 8);
        w.u32(D + 20, psn << 8);
        w.u8(D + 24, self.responder_resources);
        w.u8(D + 25, self.initiator_depth);
        w.u8(
            D + 26,
            (delay << 3) | (self.failover_accepted.code() << 1) | u8::from(self.end_to_end_flow_control),
        );
        w.u8(D + 27, (rnr << 5) | (u8::from(self.srq) << 4));
        w.u64(D + 28, self.local_ca_guid);
        w.bytes(D + 36, &self.private_data);
        Ok(())
    }

    fn decode_from(r: &Rd<'_>) -> Result<Rep, MadError> {
        let fo = (r.u8(D + 26) >> 1) & 3;
        let failover_accepted =
            FailoverAccepted::from_code(fo).ok_or(MadError::InvalidFailoverAccepted(fo))?;
        Ok(Rep {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            local_qkey: r.u32(D + 8),
            local_qpn: r.u32(D + 12) >> 8,
            local_eecn: r.u32(D + 16) >> 8,
            starting_psn: r.u32(D + 20) >> 8,
            responder_resources: r.u8(D + 24),
            initiator_depth: r.u8(D + 25),
            target_ack_delay: r.u8(D + 26) >> 3,
            failover_accepted,
            end_to_end_flow_control: r.u8(D + 26) & 1 == 1,
            rnr_retry_count: r.u8(D + 27) >> 5,
            srq: (r.u8(D + 27) >> 4) & 1 == 1,
            local_ca_guid: r.u64(D + 28),
            private_data: r.array(D + 36),
        })
    }
}

/// ReadyToUse (attribute 0x0014).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtu {
    /// Local Comm ID (the REQ sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the REP's Local Comm ID).
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

impl Default for Rtu {
    /// All fields zero.
    fn default() -> Rtu {
        Rtu { local_comm_id: 0, remote_comm_id: 0, private_data: [0; RTU_PRIVATE_DATA_LEN] }
    }
}

impl Rtu {
    fn encode_into(&self, w: &mut Wr<'_>) {
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.bytes(D + 8, &self.private_data);
    }

    fn decode_from(r: &Rd<'_>) -> Rtu {
        Rtu { local_comm_id: r.u32(D), remote_comm_id: r.u32(D + 4), private_data: r.array(D + 8) }
    }
}

/// ConnectReject (attribute 0x0012).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// Local Comm ID (the rejecter's; 0 when Linux rejects a REQ).
    pub local_comm_id: u32,
    /// Remote Comm ID (the rejected message's Local Comm ID).
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MessageRejected,
    /// How many ARI bytes are meaningful (0..=72).
    pub reject_info_length: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional reject information.
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data (consumer data only with [`RejReason::ConsumerDefined`]).
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl Default for Rej {
    /// All fields zero except the reason, [`RejReason::ConsumerDefined`].
    fn default() -> Rej {
        Rej {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: MessageRejected::Req,
            reject_info_length: 0,
            reason: RejReason::ConsumerDefined,
            ari: [0; REJ_ARI_LEN],
            private_data: [0; REJ_PRIVATE_DATA_LEN],
        }
    }
}

impl Rej {
    /// The meaningful part of the ARI.
    pub fn ari_bytes(&self) -> &[u8] {
        self.ari.get(..usize::from(self.reject_info_length)).unwrap_or(&self.ari)
    }

    fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        if usize::from(self.reject_info_length) > REJ_ARI_LEN {
            return Err(MadError::InvalidRejectInfoLength(self.reject_info_length));
        }
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u8(D + 8, self.message_rejected.code() << 6);
        w.u8(D + 9, self.reject_info_length << 1);
        w.u16(D + 10, self.reason.to_u16());
        w.bytes(D + 12, &self.ari);
        w.bytes(D + 84, &self.private_data);
        Ok(())
    }

    fn decode_from(r: &Rd<'_>) -> Result<Rej, MadError> {
        let mr = r.u8(D + 8) >> 6;
        let message_rejected = MessageRejected::from_code(mr).ok_or(MadError::InvalidMessageRejected(mr))?;
        let reject_info_length = r.u8(D + 9) >> 1;
        if usize::from(reject_info_length) > REJ_ARI_LEN {
            return Err(MadError::InvalidRejectInfoLength(reject_info_length));
        }
        Ok(Rej {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            message_rejected,
            reject_info_length,
            reason: RejReason::from_u16(r.u16(D + 10)),
            ari: r.array(D + 12),
            private_data: r.array(D + 84),
        })
    }
}

/// Message Receipt Acknowledgement (attribute 0x0011).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// Local Comm ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the acknowledged message's Local Comm ID).
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MessageMraed,
    /// Service timeout code (5 bits): how much longer the sender needs.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl Default for Mra {
    /// All fields zero.
    fn default() -> Mra {
        Mra {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_mraed: MessageMraed::Req,
            service_timeout: 0,
            private_data: [0; MRA_PRIVATE_DATA_LEN],
        }
    }
}

impl Mra {
    fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let timeout = fit8("service_timeout", self.service_timeout, 5)?;
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u8(D + 8, self.message_mraed.code() << 6);
        w.u8(D + 9, timeout << 3);
        w.bytes(D + 10, &self.private_data);
        Ok(())
    }

    fn decode_from(r: &Rd<'_>) -> Result<Mra, MadError> {
        let code = r.u8(D + 8) >> 6;
        let message_mraed = MessageMraed::from_code(code).ok_or(MadError::InvalidMessageMraed(code))?;
        Ok(Mra {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            message_mraed,
            service_timeout: r.u8(D + 9) >> 3,
            private_data: r.array(D + 10),
        })
    }
}

/// DisconnectRequest (attribute 0x0015).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dreq {
    /// Local Comm ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the peer's).
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits): the peer's QP, which the receiver checks against its own.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl Default for Dreq {
    /// All fields zero.
    fn default() -> Dreq {
        Dreq { local_comm_id: 0, remote_comm_id: 0, remote_qpn: 0, private_data: [0; DREQ_PRIVATE_DATA_LEN] }
    }
}

impl Dreq {
    fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let qpn = fit("remote_qpn", self.remote_qpn, 24)?;
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u32(D + 8, qpn << 8);
        w.bytes(D + 12, &self.private_data);
        Ok(())
    }

    fn decode_from(r: &Rd<'_>) -> Dreq {
        Dreq {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            remote_qpn: r.u32(D + 8) >> 8,
            private_data: r.array(D + 12),
        }
    }
}

/// DisconnectReply (attribute 0x0016).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drep {
    /// Local Comm ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the DREQ sender's).
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl Default for Drep {
    /// All fields zero.
    fn default() -> Drep {
        Drep { local_comm_id: 0, remote_comm_id: 0, private_data: [0; DREP_PRIVATE_DATA_LEN] }
    }
}

impl Drep {
    fn encode_into(&self, w: &mut Wr<'_>) {
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.bytes(D + 8, &self.private_data);
    }

    fn decode_from(r: &Rd<'_>) -> Drep {
        Drep { local_comm_id: r.u32(D), remote_comm_id: r.u32(D + 4), private_data: r.array(D + 8) }
    }
}

/// One CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(Req),
    /// ConnectReply.
    Rep(Rep),
    /// ReadyToUse.
    Rtu(Rtu),
    /// ConnectReject.
    Rej(Rej),
    /// Message Receipt Acknowledgement.
    Mra(Mra),
    /// DisconnectRequest.
    Dreq(Dreq),
    /// DisconnectReply.
    Drep(Drep),
}

impl CmMessage {
    /// The MAD attribute ID of this message.
    pub const fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
        }
    }

    /// The sender's comm ID.
    pub const fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::Drep(m) => m.local_comm_id,
        }
    }

    /// The receiver's comm ID as the sender knows it; `None` for a REQ, which has none.
    pub const fn remote_comm_id(&self) -> Option<u32> {
        match self {
            CmMessage::Req(_) => None,
            CmMessage::Rep(m) => Some(m.remote_comm_id),
            CmMessage::Rtu(m) => Some(m.remote_comm_id),
            CmMessage::Rej(m) => Some(m.remote_comm_id),
            CmMessage::Mra(m) => Some(m.remote_comm_id),
            CmMessage::Dreq(m) => Some(m.remote_comm_id),
            CmMessage::Drep(m) => Some(m.remote_comm_id),
        }
    }

    /// The message's name as the IBTA abbreviates it (`REQ`, `REP`, ...).
    pub const fn name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
        }
    }
}

/// A CM message with its transaction ID: everything a CM MAD carries that matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// TransactionID (see [`cm_tid`]).
    pub tid: u64,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// A CM MAD.
    pub const fn new(tid: u64, msg: CmMessage) -> CmMad {
        CmMad { tid, msg }
    }

    /// The 256 bytes of this MAD. Fails if a field does not fit its width.
    pub fn encode(&self) -> Result<Mad, MadError> {
        let mut out: Mad = [0u8; MAD_LEN];
        let mut w = Wr(&mut out);
        w.bytes(0, &MadHeader::cm(self.tid, self.msg.attr_id()).encode());
        match &self.msg {
            CmMessage::Req(m) => m.encode_into(&mut w)?,
            CmMessage::Rep(m) => m.encode_into(&mut w)?,
            CmMessage::Rtu(m) => m.encode_into(&mut w),
            CmMessage::Rej(m) => m.encode_into(&mut w)?,
            CmMessage::Mra(m) => m.encode_into(&mut w)?,
            CmMessage::Dreq(m) => m.encode_into(&mut w)?,
            CmMessage::Drep(m) => m.encode_into(&mut w),
        }
        Ok(out)
    }

    /// Parses a received MAD: exactly 256 bytes, a CM Send header, a supported attribute, and
    /// field codes inside their enums. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<CmMad, MadError> {
        if bytes.len() < MAD_LEN {
            return Err(MadError::Truncated(bytes.len()));
        }
        if bytes.len() > MAD_LEN {
            return Err(MadError::TooLong(bytes.len()));
        }
        let header = MadHeader::decode(bytes)?;
        let r = Rd(bytes);
        let msg = match header.attr_id {
            attr::REQ => CmMessage::Req(Req::decode_from(&r)?),
            attr::REP => CmMessage::Rep(Rep::decode_from(&r)?),
            attr::RTU => CmMessage::Rtu(Rtu::decode_from(&r)),
            attr::REJ => CmMessage::Rej(Rej::decode_from(&r)?),
            attr::MRA => CmMessage::Mra(Mra::decode_from(&r)?),
            attr::DREQ => CmMessage::Dreq(Dreq::decode_from(&r)),
            attr::DREP => CmMessage::Drep(Drep::decode_from(&r)),
            attr::CLASS_PORT_INFO | attr::SIDR_REQ | attr::SIDR_REP | attr::LAP | attr::APR => {
                return Err(MadError::Unsupported(header.attr_id));
            }
            other => return Err(MadError::UnknownAttribute(other)),
        };
        Ok(CmMad { tid: header.tid, msg })
    }
}

/// `value` if it fits in `bits` bits, else the out-of-range error for `field`.
fn fit(field: &'static str, value: u32, bits: u8) -> Result<u32, MadError> {
    if value.checked_shr(u32::from(bits)).unwrap_or(0) == 0 {
        Ok(value)
    } else {
        Err(MadError::FieldOutOfRange { field, value: u64::from(value), bits })
    }
}

/// [`fit`] for a byte-sized value.
fn fit8(field: &'static str, value: u8, bits: u8) -> Result<u8, MadError> {
    if value.checked_shr(u32::from(bits)).unwrap_or(0) == 0 {
        Ok(value)
    } else {
        Err(MadError::FieldOutOfRange { field, value: u64::from(value), bits })
    }
}

/// Big-endian writes at fixed offsets. Every offset used in this module is a constant inside
/// the buffer it writes (checked by the layout tests); an out-of-bounds write would be skipped,
/// never a panic.
pub(crate) struct Wr<'a>(pub(crate) &'a mut [u8]);

impl Wr<'_> {
    pub(crate) fn bytes(&mut self, off: usize, src: &[u8]) {
        if let Some(dst) = self.0.get_mut(off..off.saturating_add(src.len())) {
            dst.copy_from_slice(src);
        }
    }

    pub(crate) fn u8(&mut self, off: usize, v: u8) {
        self.bytes(off, &[v]);
    }

    pub(crate) fn u16(&mut self, off: usize, v: u16) {
        self.bytes(off, &v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, off: usize, v: u32) {
        self.bytes(off, &v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, off: usize, v: u64) {
        self.bytes(off, &v.to_be_bytes());
    }
}

/// Big-endian reads at fixed offsets of a buffer whose length the caller has checked; an
/// out-of-bounds read would yield zeros, never a panic.
pub(crate) struct Rd<'a>(pub(crate) &'a [u8]);

impl Rd<'_> {
    pub(crate) fn array<const N: usize>(&self, off: usize) -> [u8; N] {
        self.0.get(off..off.saturating_add(N)).and_then(|s| <[u8; N]>::try_from(s).ok()).unwrap_or([0; N])
    }

    pub(crate) fn u8(&self, off: usize) -> u8 {
        self.0.get(off).copied().unwrap_or(0)
    }

    pub(crate) fn u16(&self, off: usize) -> u16 {
        u16::from_be_bytes(self.array(off))
    }

    pub(crate) fn u32(&self, off: usize) -> u32 {
        u32::from_be_bytes(self.array(off))
    }

    pub(crate) fn u64(&self, off: usize) -> u64 {
        u64::from_be_bytes(self.array(off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::ip_cm::{CmaHeader, PortSpace, ip_service_id, req_private_data, split_req_private_data};

    /// Copies `bytes` into the expected image at MAD offset `off`.
    fn put(e: &mut Mad, off: usize, bytes: &[u8]) {
        e[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// The 24 header bytes every expected CM image starts with.
    fn header(e: &mut Mad, tid: u64, attr_id: u16) {
        e[0] = 0x01; // BaseVersion
        e[1] = 0x07; // MgmtClass: CM
        e[2] = 0x02; // ClassVersion
        e[3] = 0x03; // R=0, Method = Send
        // 4..6 Status = 0, 6..8 ClassSpecific = 0
        put(e, 8, &tid.to_be_bytes()); // TransactionID
        put(e, 16, &attr_id.to_be_bytes()); // AttributeID
        // 18..20 reserved, 20..24 AttributeModifier = 0
    }

    fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
        Ipv4Addr::new(a, b, c, d)
    }

    fn lnet_consumer_data() -> [u8; 56] {
        let mut c = [0u8; 56];
        c[..4].copy_from_slice(&[0x91, 0x1b, 0xe9, 0x0b]); // LNet IB magic, little-endian
        for (i, b) in c.iter_mut().enumerate().skip(4) {
            *b = i as u8;
        }
        c
    }

    fn roundtrip(m: &CmMad) -> CmMad {
        let bytes = m.encode().unwrap_or_else(|e| panic!("encode {m:?}: {e}"));
        CmMad::decode(&bytes).unwrap_or_else(|e| panic!("decode of {m:?}: {e}"))
    }

    #[test]
    fn req_roce_image() {
        let local = ip(192, 168, 1, 2);
        let remote = ip(192, 168, 1, 1);
        let cma = CmaHeader { src_port: 40000, src: local, dst: remote };
        let consumer = lnet_consumer_data();
        let pd = req_private_data(&cma, &consumer).unwrap();
        let req = Req::roce_defaults(RoceReqParams {
            local_comm_id: 0x1234_5678,
            service_id: ip_service_id(PortSpace::Tcp, 987),
            local_ca_guid: 0x0200_5eff_fe00_0102,
            local_qpn: 0x11,
            starting_psn: 0xAB_CDEF,
            local_ip: local,
            remote_ip: remote,
            path_mtu: Mtu::Mtu1024,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: true,
            retry_count: 5,
            rnr_retry_count: 6,
            private_data: pd,
        });
        let mad = CmMad::new(cm_tid(1, 0x1234_5678), CmMessage::Req(req.clone()));

        let mut e: Mad = [0; 256];
        header(&mut e, 0x0000_0001_1234_5678, 0x0010);
        put(&mut e, 24, &[0x12, 0x34, 0x56, 0x78]); // 24+0 Local Comm ID
        // 24+4 reserved
        put(&mut e, 24 + 8, &[0, 0, 0, 0, 0x01, 0x06, 0x03, 0xDB]); // 24+8 Service ID, TCP 987
        put(&mut e, 24 + 16, &[0x02, 0x00, 0x5e, 0xff, 0xfe, 0x00, 0x01, 0x02]); // CA GUID
        // 24+24 reserved; 24+28 Local Q_Key = 0
        put(&mut e, 24 + 32, &[0x00, 0x00, 0x11, 0x00]); // Local QPN 0x11, Responder Res. 0
        // 24+36 Local EECN 0, Initiator Depth 0; 24+40 Remote EECN 0
        e[24 + 43] = 0xA1; // Remote CM Resp Timeout 20<<3 | RC 0<<1 | E2E flow control 1
        put(&mut e, 24 + 44, &[0xAB, 0xCD, 0xEF]); // Starting PSN
        e[24 + 47] = 0xA5; // Local CM Response Timeout 20<<3 | Retry Count 5
        put(&mut e, 24 + 48, &[0xFF, 0xFF]); // P_Key
        e[24 + 50] = 0x36; // Path MTU 3 (1024)<<4 | RDC Exists 0<<3 | RNR Retry Count 6
        e[24 + 51] = 0xF0; // Max CM Retries 15<<4 | SRQ 0<<3 | Extended Transport Type 0
        put(&mut e, 24 + 52, &[0xFF, 0xFF]); // Primary Local Port LID (permissive)
        put(&mut e, 24 + 54, &[0xFF, 0xFF]); // Primary Remote Port LID
        put(&mut e, 24 + 56, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2]);
        put(&mut e, 24 + 72, &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 1]);
        // 24+88 Flow Label 0, Packet Rate 0; 24+92 Traffic Class 0
        e[24 + 93] = 64; // Hop Limit
        // 24+94 SL 0, Subnet Local 0
        e[24 + 95] = 0x88; // Local ACK Timeout 17<<3
        // 24+96..24+140 Alternate path: all zero
        // 24+140 Private Data: cma_hdr
        e[24 + 140] = 0x00; // cma version
        e[24 + 141] = 0x40; // IPv4
        put(&mut e, 24 + 142, &[0x9C, 0x40]); // source port 40000
        put(&mut e, 24 + 140 + 16, &[192, 168, 1, 2]); // source IPv4, after 12 zero bytes
        put(&mut e, 24 + 140 + 32, &[192, 168, 1, 1]); // destination IPv4
        put(&mut e, 24 + 140 + 36, &consumer); // 56 bytes consumer data to the end
        assert_eq!(24 + 140 + 36 + 56, 256);

        assert_eq!(mad.encode().unwrap(), e);
        let back = CmMad::decode(&e).unwrap();
        assert_eq!(back, mad);
        let CmMessage::Req(r) = back.msg else { panic!("not a REQ") };
        let (h, c) = split_req_private_data(&r.private_data).unwrap();
        assert_eq!(h, cma);
        assert_eq!(c, &consumer);
    }

    #[test]
    fn rep_image() {
        let mut pd = [0u8; REP_PRIVATE_DATA_LEN];
        pd[..4].copy_from_slice(&[0x91, 0x1b, 0xe9, 0x0b]);
        pd[195] = 0xEE;
        let rep = Rep {
            local_comm_id: 0x9ABC_DEF0,
            remote_comm_id: 0x1234_5678,
            local_qkey: 0,
            local_qpn: 0x00_0022,
            local_eecn: 0,
            starting_psn: 0x12_3456,
            responder_resources: 1,
            initiator_depth: 2,
            target_ack_delay: 15,
            failover_accepted: FailoverAccepted::NotSupported,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x0200_5eff_fe00_0101,
            private_data: pd,
        };
        let mad = CmMad::new(0x0000_0001_1234_5678, CmMessage::Rep(rep));
        let mut e: Mad = [0; 256];
        header(&mut e, 0x0000_0001_1234_5678, 0x0013);
        put(&mut e, 24, &[0x9A, 0xBC, 0xDE, 0xF0]); // 24+0 Local Comm ID
        put(&mut e, 24 + 4, &[0x12, 0x34, 0x56, 0x78]); // 24+4 Remote Comm ID
        // 24+8 Local Q_Key 0
        put(&mut e, 24 + 12, &[0x00, 0x00, 0x22, 0x00]); // 24+12 Local QPN (w>>8)
        // 24+16 Local EECN 0
        put(&mut e, 24 + 20, &[0x12, 0x34, 0x56, 0x00]); // 24+20 Starting PSN (w>>8)
        e[24 + 24] = 1; // Responder Resources
        e[24 + 25] = 2; // Initiator Depth
        e[24 + 26] = 0x7B; // Target ACK Delay 15<<3 | Failover Accepted 1<<1 | E2E 1
        e[24 + 27] = 0xE0; // RNR Retry Count 7<<5 | SRQ 0<<4
        put(&mut e, 24 + 28, &[0x02, 0x00, 0x5e, 0xff, 0xfe, 0x00, 0x01, 0x01]); // CA GUID
        put(&mut e, 24 + 36, &[0x91, 0x1b, 0xe9, 0x0b]); // Private Data (196)
        e[24 + 36 + 195] = 0xEE; // last private byte = last MAD byte
        assert_eq!(24 + 36 + 195, 255);
        assert_eq!(mad.encode().unwrap(), e);
        assert_eq!(CmMad::decode(&e).unwrap(), mad);
    }

    #[test]
    fn rej_consumer_reject_image() {
        let mut pd = [0u8; REJ_PRIVATE_DATA_LEN];
        for (i, b) in pd.iter_mut().take(24).enumerate() {
            *b = 0xA0 + i as u8;
        }
        let rej = Rej {
            local_comm_id: 0,
            remote_comm_id: 0x1234_5678,
            message_rejected: MessageRejected::Req,
            reject_info_length: 0,
            reason: RejReason::from_u16(28),
            ari: [0; REJ_ARI_LEN],
            private_data: pd,
        };
        assert_eq!(rej.reason, RejReason::ConsumerDefined);
        let mad = CmMad::new(0x0000_0001_1234_5678, CmMessage::Rej(rej));
        let mut e: Mad = [0; 256];
        header(&mut e, 0x0000_0001_1234_5678, 0x0012);
        // 24+0 Local Comm ID 0 (Linux rejecting a REQ)
        put(&mut e, 24 + 4, &[0x12, 0x34, 0x56, 0x78]); // 24+4 Remote Comm ID
        e[24 + 8] = 0x00; // Message REJected 0 (REQ) << 6
        e[24 + 9] = 0x00; // Reject Info Length 0 << 1
        put(&mut e, 24 + 10, &[0x00, 28]); // Reason 28, consumer defined
        // 24+12..24+84 ARI, unused
        for i in 0..24 {
            e[24 + 84 + i] = 0xA0 + i as u8; // 24 bytes of private data
        }
        assert_eq!(mad.encode().unwrap(), e);
        assert_eq!(CmMad::decode(&e).unwrap(), mad);
    }

    #[test]
    fn rtu_image() {
        let mad = CmMad::new(
            0x0000_0001_1234_5678,
            CmMessage::Rtu(Rtu {
                local_comm_id: 0x1234_5678,
                remote_comm_id: 0x9ABC_DEF0,
                ..Default::default()
            }),
        );
        let mut e: Mad = [0; 256];
        header(&mut e, 0x0000_0001_1234_5678, 0x0014);
        put(&mut e, 24, &[0x12, 0x34, 0x56, 0x78]); // 24+0 Local Comm ID
        put(&mut e, 24 + 4, &[0x9A, 0xBC, 0xDE, 0xF0]); // 24+4 Remote Comm ID
        // 24+8..256 private data, zero
        assert_eq!(mad.encode().unwrap(), e);
        assert_eq!(CmMad::decode(&e).unwrap(), mad);
    }

    #[test]
    fn dreq_image() {
        let mut pd = [0u8; DREQ_PRIVATE_DATA_LEN];
        pd[219] = 0x5A;
        let mad = CmMad::new(
            cm_tid(0xCAFE_F00D, 0x1234_5678),
            CmMessage::Dreq(Dreq {
                local_comm_id: 0x1234_5678,
                remote_comm_id: 0x9ABC_DEF0,
                remote_qpn: 0x00_0022,
                private_data: pd,
            }),
        );
        let mut e: Mad = [0; 256];
        header(&mut e, 0xCAFE_F00D_1234_5678, 0x0015);
        put(&mut e, 24, &[0x12, 0x34, 0x56, 0x78]); // 24+0 Local Comm ID
        put(&mut e, 24 + 4, &[0x9A, 0xBC, 0xDE, 0xF0]); // 24+4 Remote Comm ID
        put(&mut e, 24 + 8, &[0x00, 0x00, 0x22, 0x00]); // 24+8 Remote QPN/EECN (w>>8)
        e[24 + 12 + 219] = 0x5A; // last of 220 private bytes
        assert_eq!(mad.encode().unwrap(), e);
        assert_eq!(CmMad::decode(&e).unwrap(), mad);
    }

    #[test]
    fn mra_and_drep_images() {
        let mra = CmMad::new(
            7,
            CmMessage::Mra(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: MessageMraed::Rep,
                service_timeout: 24,
                ..Default::default()
            }),
        );
        let mut e: Mad = [0; 256];
        header(&mut e, 7, 0x0011);
        put(&mut e, 24, &[0, 0, 0, 1]); // Local Comm ID
        put(&mut e, 24 + 4, &[0, 0, 0, 2]); // Remote Comm ID
        e[24 + 8] = 0x40; // Message MRAed 1 (REP) << 6
        e[24 + 9] = 0xC0; // Service Timeout 24 << 3
        assert_eq!(mra.encode().unwrap(), e);
        assert_eq!(CmMad::decode(&e).unwrap(), mra);

        let drep = CmMad::new(
            8,
            CmMessage::Drep(Drep { local_comm_id: 3, remote_comm_id: 4, ..Default::default() }),
        );
        let mut e: Mad = [0; 256];
        header(&mut e, 8, 0x0016);
        put(&mut e, 24, &[0, 0, 0, 3]); // Local Comm ID
        put(&mut e, 24 + 4, &[0, 0, 0, 4]); // Remote Comm ID
        assert_eq!(drep.encode().unwrap(), e);
        assert_eq!(CmMad::decode(&e).unwrap(), drep);
    }

    fn max_path() -> PathRecord {
        PathRecord {
            local_lid: u16::MAX,
            remote_lid: u16::MAX,
            local_gid: Gid([0xFF; 16]),
            remote_gid: Gid([0xFF; 16]),
            flow_label: 0xF_FFFF,
            packet_rate: 0x3F,
            traffic_class: u8::MAX,
            hop_limit: u8::MAX,
            sl: 15,
            subnet_local: true,
            local_ack_timeout: 31,
        }
    }

    fn max_req() -> Req {
        Req {
            local_comm_id: u32::MAX,
            service_id: u64::MAX,
            local_ca_guid: u64::MAX,
            local_qkey: u32::MAX,
            local_qpn: 0xFF_FFFF,
            responder_resources: u8::MAX,
            local_eecn: 0xFF_FFFF,
            initiator_depth: u8::MAX,
            remote_eecn: 0xFF_FFFF,
            remote_cm_response_timeout: 31,
            transport_type: TransportType::Xrc,
            end_to_end_flow_control: true,
            starting_psn: 0xFF_FFFF,
            local_cm_response_timeout: 31,
            retry_count: 7,
            pkey: u16::MAX,
            path_mtu: Mtu::Mtu4096,
            rdc_exists: true,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: true,
            extended_transport_type: 7,
            primary_path: max_path(),
            alternate_path: Some(max_path()),
            sap_supported: true,
            private_data: [0xFF; REQ_PRIVATE_DATA_LEN],
        }
    }

    fn max_rep() -> Rep {
        Rep {
            local_comm_id: u32::MAX,
            remote_comm_id: u32::MAX,
            local_qkey: u32::MAX,
            local_qpn: 0xFF_FFFF,
            local_eecn: 0xFF_FFFF,
            starting_psn: 0xFF_FFFF,
            responder_resources: u8::MAX,
            initiator_depth: u8::MAX,
            target_ack_delay: 31,
            failover_accepted: FailoverAccepted::Rejected,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: u64::MAX,
            private_data: [0xFF; REP_PRIVATE_DATA_LEN],
        }
    }

    fn all_max() -> Vec<CmMessage> {
        vec![
            CmMessage::Req(max_req()),
            CmMessage::Rep(max_rep()),
            CmMessage::Rtu(Rtu {
                local_comm_id: u32::MAX,
                remote_comm_id: u32::MAX,
                private_data: [0xFF; RTU_PRIVATE_DATA_LEN],
            }),
            CmMessage::Rej(Rej {
                local_comm_id: u32::MAX,
                remote_comm_id: u32::MAX,
                message_rejected: MessageRejected::Other,
                reject_info_length: 72,
                reason: RejReason::Other(u16::MAX),
                ari: [0xFF; REJ_ARI_LEN],
                private_data: [0xFF; REJ_PRIVATE_DATA_LEN],
            }),
            CmMessage::Mra(Mra {
                local_comm_id: u32::MAX,
                remote_comm_id: u32::MAX,
                message_mraed: MessageMraed::Lap,
                service_timeout: 31,
                private_data: [0xFF; MRA_PRIVATE_DATA_LEN],
            }),
            CmMessage::Dreq(Dreq {
                local_comm_id: u32::MAX,
                remote_comm_id: u32::MAX,
                remote_qpn: 0xFF_FFFF,
                private_data: [0xFF; DREQ_PRIVATE_DATA_LEN],
            }),
            CmMessage::Drep(Drep {
                local_comm_id: u32::MAX,
                remote_comm_id: u32::MAX,
                private_data: [0xFF; DREP_PRIVATE_DATA_LEN],
            }),
        ]
    }

    fn all_min() -> Vec<CmMessage> {
        vec![
            CmMessage::Req(Req { path_mtu: Mtu::Mtu256, ..Req::default() }),
            CmMessage::Rep(Rep::default()),
            CmMessage::Rtu(Rtu::default()),
            CmMessage::Rej(Rej { reason: RejReason::Other(0), ..Rej::default() }),
            CmMessage::Mra(Mra::default()),
            CmMessage::Dreq(Dreq::default()),
            CmMessage::Drep(Drep::default()),
        ]
    }

    #[test]
    fn roundtrip_extremes() {
        for (i, msg) in all_max().into_iter().chain(all_min()).enumerate() {
            for tid in [0, u64::MAX, cm_tid(u32::MAX, 1)] {
                let m = CmMad::new(tid, msg.clone());
                assert_eq!(roundtrip(&m), m, "case {i} tid {tid:#x}");
            }
        }
    }

    #[test]
    fn roundtrip_every_enum_value() {
        for tt in [TransportType::Rc, TransportType::Uc, TransportType::Xrc] {
            for mtu in [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096] {
                let m = CmMad::new(1, CmMessage::Req(Req { transport_type: tt, path_mtu: mtu, ..max_req() }));
                assert_eq!(roundtrip(&m), m);
            }
        }
        for fo in [FailoverAccepted::Accepted, FailoverAccepted::NotSupported, FailoverAccepted::Rejected] {
            let m = CmMad::new(1, CmMessage::Rep(Rep { failover_accepted: fo, ..max_rep() }));
            assert_eq!(roundtrip(&m), m);
        }
        for mr in [MessageRejected::Req, MessageRejected::Rep, MessageRejected::Other] {
            for code in 0..=40u16 {
                let m = CmMad::new(
                    1,
                    CmMessage::Rej(Rej {
                        message_rejected: mr,
                        reason: RejReason::from_u16(code),
                        ..Rej::default()
                    }),
                );
                assert_eq!(roundtrip(&m), m);
            }
        }
        for mm in [MessageMraed::Req, MessageMraed::Rep, MessageMraed::Lap] {
            let m = CmMad::new(1, CmMessage::Mra(Mra { message_mraed: mm, ..Mra::default() }));
            assert_eq!(roundtrip(&m), m);
        }
    }

    /// With every field at its maximum, exactly the non-reserved bits of a REQ are set.
    #[test]
    fn req_max_sets_exactly_the_defined_bits() {
        let got = CmMad::new(u64::MAX, CmMessage::Req(max_req())).encode().unwrap();
        let mut e: Mad = [0xFF; 256];
        e[..24].copy_from_slice(&MadHeader::cm(u64::MAX, attr::REQ).encode());
        put(&mut e, 24 + 4, &[0; 4]); // reserved
        put(&mut e, 24 + 24, &[0; 4]); // reserved
        for base in [24 + 52, 24 + 96] {
            e[base + 38] = 0xF0; // flow label's last nibble, then reserved
            e[base + 39] = 0x3F; // 2 reserved bits, packet rate
            e[base + 42] = 0xF8; // SL, subnet local, 3 reserved bits
            e[base + 43] = 0xF8; // ACK timeout, 3 reserved bits
        }
        e[24 + 139] = 0xFC; // alternate ACK timeout, SAP supported, 2 reserved bits
        e[24 + 43] = 0xFF; // remote CM resp timeout 31, XRC (3), E2E
        e[24 + 50] = (5 << 4) | 0x0F; // MTU code 5, RDC, RNR 7
        assert_eq!(got, e);
    }

    #[test]
    fn rep_max_sets_exactly_the_defined_bits() {
        let got = CmMad::new(0, CmMessage::Rep(max_rep())).encode().unwrap();
        let mut e: Mad = [0xFF; 256];
        e[..24].copy_from_slice(&MadHeader::cm(0, attr::REP).encode());
        e[24 + 26] = (31 << 3) | (2 << 1) | 1; // failover "rejected" = 2
        e[24 + 27] = 0xF0; // RNR 7, SRQ, 4 reserved bits
        put(&mut e, 24 + 15, &[0]); // Local QPN low byte reserved
        put(&mut e, 24 + 19, &[0]); // Local EECN low byte reserved
        put(&mut e, 24 + 23, &[0]); // Starting PSN low byte reserved
        assert_eq!(got, e);
    }

    #[test]
    fn reserved_bits_are_ignored_and_cleared() {
        let clean = CmMad::new(5, CmMessage::Req(max_req())).encode().unwrap();
        let mut dirty = [0xFF; 256];
        dirty[..24].copy_from_slice(&clean[..24]);
        dirty[24 + 50] = clean[24 + 50]; // MTU code 15 is invalid, not reserved
        let decoded = CmMad::decode(&dirty).unwrap();
        assert_eq!(decoded, CmMad::new(5, CmMessage::Req(max_req())));
        assert_eq!(decoded.encode().unwrap(), clean);
    }

    #[test]
    fn zero_alternate_path_is_none() {
        let req = Req { alternate_path: Some(PathRecord::default()), ..Req::default() };
        let bytes = CmMad::new(1, CmMessage::Req(req)).encode().unwrap();
        assert!(bytes[24 + 96..24 + 140].iter().all(|&b| b == 0));
        let CmMessage::Req(back) = CmMad::decode(&bytes).unwrap().msg else { panic!() };
        assert_eq!(back.alternate_path, None);
        // The SAP bit alone does not make an alternate path.
        let req = Req { sap_supported: true, ..Req::default() };
        let bytes = CmMad::new(1, CmMessage::Req(req.clone())).encode().unwrap();
        assert_eq!(bytes[24 + 139], 1 << 2);
        let CmMessage::Req(back) = CmMad::decode(&bytes).unwrap().msg else { panic!() };
        assert_eq!(back, req);
    }

    fn valid_req_bytes() -> Mad {
        CmMad::new(9, CmMessage::Req(max_req())).encode().unwrap()
    }

    #[test]
    fn decode_length_errors() {
        let good = valid_req_bytes();
        assert_eq!(CmMad::decode(&[]), Err(MadError::Truncated(0)));
        assert_eq!(CmMad::decode(&good[..23]), Err(MadError::Truncated(23)));
        assert_eq!(CmMad::decode(&good[..255]), Err(MadError::Truncated(255)));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(CmMad::decode(&long), Err(MadError::TooLong(257)));
        assert_eq!(MadHeader::decode(&good[..23]), Err(MadError::Truncated(23)));
        assert!(MadHeader::decode(&good[..24]).is_ok());
    }

    #[test]
    fn decode_header_errors() {
        let good = valid_req_bytes();
        let with = |off: usize, v: u8| {
            let mut b = good;
            b[off] = v;
            CmMad::decode(&b)
        };
        assert_eq!(with(0, 0), Err(MadError::BadBaseVersion(0)));
        assert_eq!(with(0, 2), Err(MadError::BadBaseVersion(2)));
        assert_eq!(with(1, 0x03), Err(MadError::BadMgmtClass(0x03)));
        assert_eq!(with(2, 1), Err(MadError::BadClassVersion(1)));
        assert_eq!(with(3, 0x01), Err(MadError::BadMethod(0x01)));
        assert_eq!(with(3, 0x83), Err(MadError::BadMethod(0x83)));
        assert_eq!(with(3, 0x81), Err(MadError::BadMethod(0x81)));
        // Checks run in header order: base version first.
        let mut b = good;
        b[0] = 9;
        b[1] = 9;
        b[2] = 9;
        b[3] = 9;
        assert_eq!(CmMad::decode(&b), Err(MadError::BadBaseVersion(9)));
        // Status, class-specific and attribute modifier are not checked.
        let mut b = good;
        b[4] = 0xFF;
        b[7] = 0xFF;
        b[18] = 0xFF;
        b[23] = 0xFF;
        assert_eq!(CmMad::decode(&b).unwrap(), CmMad::new(9, CmMessage::Req(max_req())));
    }

    #[test]
    fn decode_attribute_errors() {
        let good = valid_req_bytes();
        let with_attr = |a: u16| {
            let mut b = good;
            b[16..18].copy_from_slice(&a.to_be_bytes());
            CmMad::decode(&b)
        };
        for a in [attr::CLASS_PORT_INFO, attr::SIDR_REQ, attr::SIDR_REP, attr::LAP, attr::APR] {
            assert_eq!(with_attr(a), Err(MadError::Unsupported(a)));
        }
        for a in [0x0000, 0x0002, 0x000F, 0x001B, 0x0100, 0xFFFF] {
            assert_eq!(with_attr(a), Err(MadError::UnknownAttribute(a)));
        }
    }

    #[test]
    fn decode_enum_errors() {
        let req = valid_req_bytes();
        let mut b = req;
        b[24 + 43] = (b[24 + 43] & !0x06) | (2 << 1);
        assert_eq!(CmMad::decode(&b), Err(MadError::InvalidTransportType(2)));
        for code in [0u8, 6, 7, 15] {
            let mut b = req;
            b[24 + 50] = (code << 4) | (b[24 + 50] & 0x0F);
            assert_eq!(CmMad::decode(&b), Err(MadError::InvalidMtu(code)));
        }

        let rep = CmMad::new(1, CmMessage::Rep(max_rep())).encode().unwrap();
        let mut b = rep;
        b[24 + 26] |= 3 << 1;
        assert_eq!(CmMad::decode(&b), Err(MadError::InvalidFailoverAccepted(3)));

        let rej = CmMad::new(1, CmMessage::Rej(Rej::default())).encode().unwrap();
        let mut b = rej;
        b[24 + 8] = 3 << 6;
        assert_eq!(CmMad::decode(&b), Err(MadError::InvalidMessageRejected(3)));
        for len in [73u8, 100, 127] {
            let mut b = rej;
            b[24 + 9] = len << 1;
            assert_eq!(CmMad::decode(&b), Err(MadError::InvalidRejectInfoLength(len)));
        }
        let mut b = rej;
        b[24 + 9] = (72 << 1) | 1; // the low bit is reserved
        let CmMessage::Rej(r) = CmMad::decode(&b).unwrap().msg else { panic!() };
        assert_eq!(r.reject_info_length, 72);
        assert_eq!(r.ari_bytes().len(), 72);

        let mra = CmMad::new(1, CmMessage::Mra(Mra::default())).encode().unwrap();
        let mut b = mra;
        b[24 + 8] = 3 << 6;
        assert_eq!(CmMad::decode(&b), Err(MadError::InvalidMessageMraed(3)));
    }

    #[test]
    fn encode_rejects_out_of_range_fields() {
        fn field_err(msg: CmMessage) -> Option<&'static str> {
            match CmMad::new(0, msg).encode() {
                Err(MadError::FieldOutOfRange { field, .. }) => Some(field),
                _ => None,
            }
        }
        type ReqEdit = fn(&mut Req);
        let req_cases: &[(&str, ReqEdit)] = &[
            ("local_qpn", |r| r.local_qpn = 0x100_0000),
            ("local_eecn", |r| r.local_eecn = 0x100_0000),
            ("remote_eecn", |r| r.remote_eecn = u32::MAX),
            ("remote_cm_response_timeout", |r| r.remote_cm_response_timeout = 32),
            ("starting_psn", |r| r.starting_psn = 0x100_0000),
            ("local_cm_response_timeout", |r| r.local_cm_response_timeout = 255),
            ("retry_count", |r| r.retry_count = 8),
            ("rnr_retry_count", |r| r.rnr_retry_count = 8),
            ("max_cm_retries", |r| r.max_cm_retries = 16),
            ("extended_transport_type", |r| r.extended_transport_type = 8),
            ("primary_path.flow_label", |r| r.primary_path.flow_label = 0x10_0000),
            ("primary_path.packet_rate", |r| r.primary_path.packet_rate = 64),
            ("primary_path.sl", |r| r.primary_path.sl = 16),
            ("primary_path.local_ack_timeout", |r| r.primary_path.local_ack_timeout = 32),
            ("alternate_path.flow_label", |r| {
                r.alternate_path = Some(PathRecord { flow_label: 0x10_0000, ..max_path() })
            }),
            ("alternate_path.packet_rate", |r| {
                r.alternate_path = Some(PathRecord { packet_rate: 0x40, ..max_path() })
            }),
            ("alternate_path.sl", |r| r.alternate_path = Some(PathRecord { sl: 16, ..max_path() })),
            ("alternate_path.local_ack_timeout", |r| {
                r.alternate_path = Some(PathRecord { local_ack_timeout: 32, ..max_path() })
            }),
        ];
        for (field, edit) in req_cases {
            let mut r = max_req();
            edit(&mut r);
            assert_eq!(field_err(CmMessage::Req(r)), Some(*field));
        }
        type RepEdit = fn(&mut Rep);
        let rep_cases: &[(&str, RepEdit)] = &[
            ("local_qpn", |r| r.local_qpn = 0x100_0000),
            ("local_eecn", |r| r.local_eecn = 0x100_0000),
            ("starting_psn", |r| r.starting_psn = 0x100_0000),
            ("target_ack_delay", |r| r.target_ack_delay = 32),
            ("rnr_retry_count", |r| r.rnr_retry_count = 8),
        ];
        for (field, edit) in rep_cases {
            let mut r = max_rep();
            edit(&mut r);
            assert_eq!(field_err(CmMessage::Rep(r)), Some(*field));
        }
        assert_eq!(
            field_err(CmMessage::Mra(Mra { service_timeout: 32, ..Mra::default() })),
            Some("service_timeout")
        );
        assert_eq!(
            field_err(CmMessage::Dreq(Dreq { remote_qpn: 0x100_0000, ..Dreq::default() })),
            Some("remote_qpn")
        );
        let err = CmMad::new(0, CmMessage::Rej(Rej { reject_info_length: 73, ..Rej::default() })).encode();
        assert_eq!(err, Err(MadError::InvalidRejectInfoLength(73)));
        let err = CmMad::new(0, CmMessage::Req(Req { local_qpn: 0x123_4567, ..Req::default() })).encode();
        assert_eq!(err, Err(MadError::FieldOutOfRange { field: "local_qpn", value: 0x123_4567, bits: 24 }));
        // A RoCE REQ built with a bad QPN fails to encode rather than truncating.
        let p = RoceReqParams {
            local_comm_id: 1,
            service_id: 0,
            local_ca_guid: 0,
            local_qpn: 0x100_0000,
            starting_psn: 0,
            local_ip: Ipv4Addr::LOCALHOST,
            remote_ip: Ipv4Addr::LOCALHOST,
            path_mtu: Mtu::Mtu1024,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: true,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: [0; 92],
        };
        assert_eq!(field_err(CmMessage::Req(Req::roce_defaults(p))), Some("local_qpn"));
    }

    #[test]
    fn roce_defaults_and_path_rule() {
        let p = PathRecord::roce(ip(10, 0, 0, 1), ip(10, 0, 0, 2), 64);
        assert_eq!((p.local_lid, p.remote_lid, p.subnet_local), (0xFFFF, 0xFFFF, false));
        assert_eq!(p.local_gid.to_ipv4(), Some(ip(10, 0, 0, 1)));
        assert_eq!(p.remote_gid.to_ipv4(), Some(ip(10, 0, 0, 2)));
        let p = PathRecord::roce(ip(10, 0, 0, 1), ip(10, 0, 0, 2), 1);
        assert_eq!((p.local_lid, p.remote_lid, p.subnet_local), (0, 0, true));
    }

    #[test]
    fn timeouts() {
        assert_eq!(cm_timeout(0), Duration::from_nanos(4096));
        assert_eq!(cm_timeout(20), Duration::from_nanos(4096 << 20)); // ≈ 4.29 s
        assert_eq!(cm_timeout(31), Duration::from_nanos(4096 << 31));
        assert_eq!(cm_timeout(200), cm_timeout(31));
        assert_eq!(linux_cm_timeout(0), Duration::from_millis(1));
        assert_eq!(linux_cm_timeout(8), Duration::from_millis(1));
        assert_eq!(linux_cm_timeout(9), Duration::from_millis(2));
        assert_eq!(linux_cm_timeout(20), Duration::from_millis(4096));
        assert_eq!(linux_cm_timeout(24), Duration::from_millis(65536));
        assert_eq!(linux_cm_timeout(31), Duration::from_millis(1 << 23));
        assert_eq!(linux_cm_timeout(u8::MAX), linux_cm_timeout(31));
        // The approximation stays within a factor 1.05 of the exact value above t = 8.
        for t in 8..=31u8 {
            let exact = cm_timeout(t).as_nanos() as f64;
            let approx = linux_cm_timeout(t).as_nanos() as f64;
            assert!((approx / exact - 1.0).abs() < 0.05, "t = {t}");
        }
    }

    #[test]
    fn tid_helper() {
        assert_eq!(cm_tid(0, 0), 0);
        assert_eq!(cm_tid(1, 0x1234_5678), 0x0000_0001_1234_5678);
        assert_eq!(cm_tid(u32::MAX, u32::MAX), u64::MAX);
    }

    #[test]
    fn rej_reasons() {
        let named: Vec<u16> = (1..=33).chain([35]).collect();
        for code in 0..=u16::MAX {
            let r = RejReason::from_u16(code);
            assert_eq!(r.to_u16(), code);
            assert_eq!(u16::from(RejReason::from(code)), code);
            let is_named = named.contains(&code);
            assert_eq!(!matches!(r, RejReason::Other(_)), is_named, "code {code}");
            assert_eq!(r.ibta_name().is_some(), is_named, "code {code}");
        }
        assert_eq!(RejReason::from_u16(8), RejReason::InvalidServiceId);
        assert_eq!(RejReason::from_u16(10), RejReason::StaleConn);
        assert_eq!(RejReason::from_u16(12), RejReason::InvalidGid);
        assert_eq!(RejReason::from_u16(28), RejReason::ConsumerDefined);
        assert_eq!(RejReason::from_u16(35), RejReason::VendorOptionNotSupported);
        assert_eq!(RejReason::ConsumerDefined.to_string(), "Consumer Reject (28)");
        assert_eq!(RejReason::StaleConn.to_string(), "Stale connection (10)");
        assert_eq!(RejReason::Other(34).to_string(), "Unknown reject reason (34)");
    }

    #[test]
    fn message_accessors() {
        for m in all_max() {
            assert_eq!(m.local_comm_id(), u32::MAX);
            assert_eq!(m.remote_comm_id().is_none(), matches!(m, CmMessage::Req(_)));
            assert!(!m.name().is_empty());
        }
    }

    /// xorshift64: deterministic, seeded with a constant.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn byte(&mut self) -> u8 {
            self.next() as u8
        }
        fn fill(&mut self, buf: &mut [u8]) {
            for b in buf {
                *b = self.byte();
            }
        }
        fn bits(&mut self, n: u32) -> u32 {
            (self.next() as u32) & ((1u32 << n) - 1)
        }
        fn arr<const N: usize>(&mut self) -> [u8; N] {
            let mut a = [0u8; N];
            self.fill(&mut a);
            a
        }
    }

    fn random_path(rng: &mut XorShift) -> PathRecord {
        PathRecord {
            local_lid: rng.next() as u16,
            remote_lid: rng.next() as u16,
            local_gid: Gid(rng.arr()),
            remote_gid: Gid(rng.arr()),
            flow_label: rng.bits(20),
            packet_rate: rng.bits(6) as u8,
            traffic_class: rng.byte(),
            hop_limit: rng.byte(),
            sl: rng.bits(4) as u8,
            subnet_local: rng.next() & 1 == 1,
            local_ack_timeout: rng.bits(5) as u8,
        }
    }

    /// A random, encodable message of a random type.
    fn random_msg(rng: &mut XorShift) -> CmMessage {
        let (lc, rc) = (rng.next() as u32, rng.next() as u32);
        match rng.below(7) {
            0 => CmMessage::Req(Req {
                local_comm_id: lc,
                service_id: rng.next(),
                local_ca_guid: rng.next(),
                local_qkey: rng.next() as u32,
                local_qpn: rng.bits(24),
                responder_resources: rng.byte(),
                local_eecn: rng.bits(24),
                initiator_depth: rng.byte(),
                remote_eecn: rng.bits(24),
                remote_cm_response_timeout: rng.bits(5) as u8,
                transport_type: [TransportType::Rc, TransportType::Uc, TransportType::Xrc]
                    [rng.below(3) as usize],
                end_to_end_flow_control: rng.next() & 1 == 1,
                starting_psn: rng.bits(24),
                local_cm_response_timeout: rng.bits(5) as u8,
                retry_count: rng.bits(3) as u8,
                pkey: rng.next() as u16,
                path_mtu: Mtu::from_code(1 + rng.below(5) as u8).unwrap(),
                rdc_exists: rng.next() & 1 == 1,
                rnr_retry_count: rng.bits(3) as u8,
                max_cm_retries: rng.bits(4) as u8,
                srq: rng.next() & 1 == 1,
                extended_transport_type: rng.bits(3) as u8,
                primary_path: random_path(rng),
                alternate_path: if rng.next() & 1 == 1 { Some(random_path(rng)) } else { None },
                sap_supported: rng.next() & 1 == 1,
                private_data: rng.arr(),
            }),
            1 => CmMessage::Rep(Rep {
                local_comm_id: lc,
                remote_comm_id: rc,
                local_qkey: rng.next() as u32,
                local_qpn: rng.bits(24),
                local_eecn: rng.bits(24),
                starting_psn: rng.bits(24),
                responder_resources: rng.byte(),
                initiator_depth: rng.byte(),
                target_ack_delay: rng.bits(5) as u8,
                failover_accepted: FailoverAccepted::from_code(rng.below(3) as u8).unwrap(),
                end_to_end_flow_control: rng.next() & 1 == 1,
                rnr_retry_count: rng.bits(3) as u8,
                srq: rng.next() & 1 == 1,
                local_ca_guid: rng.next(),
                private_data: rng.arr(),
            }),
            2 => CmMessage::Rtu(Rtu { local_comm_id: lc, remote_comm_id: rc, private_data: rng.arr() }),
            3 => CmMessage::Rej(Rej {
                local_comm_id: lc,
                remote_comm_id: rc,
                message_rejected: MessageRejected::from_code(rng.below(3) as u8).unwrap(),
                reject_info_length: rng.below(73) as u8,
                reason: RejReason::from_u16(rng.next() as u16 % 40),
                ari: rng.arr(),
                private_data: rng.arr(),
            }),
            4 => CmMessage::Mra(Mra {
                local_comm_id: lc,
                remote_comm_id: rc,
                message_mraed: MessageMraed::from_code(rng.below(3) as u8).unwrap(),
                service_timeout: rng.bits(5) as u8,
                private_data: rng.arr(),
            }),
            5 => CmMessage::Dreq(Dreq {
                local_comm_id: lc,
                remote_comm_id: rc,
                remote_qpn: rng.bits(24),
                private_data: rng.arr(),
            }),
            _ => CmMessage::Drep(Drep { local_comm_id: lc, remote_comm_id: rc, private_data: rng.arr() }),
        }
    }

    #[test]
    fn random_messages_roundtrip() {
        const SEED: u64 = 0x5EED_CAFE_F00D_0001;
        let mut rng = XorShift(SEED);
        for i in 0..5_000 {
            let m = CmMad::new(rng.next(), random_msg(&mut rng));
            let bytes = m.encode().unwrap_or_else(|e| panic!("seed {SEED:#x} iter {i}: {e}"));
            let back = CmMad::decode(&bytes);
            // A random alternate path is never all zero in practice; compare fully.
            assert_eq!(back.as_ref(), Ok(&m), "seed {SEED:#x} iter {i}");
        }
    }

    /// 100k random, bit-flipped, truncated and extended buffers: decoding never panics, and
    /// whatever decodes re-encodes to bytes that decode to the same thing.
    #[test]
    fn fuzz_decode_never_panics() {
        const SEED: u64 = 0x0123_4567_89AB_CDEF;
        const ATTRS: [u16; 14] = [
            0x0001, 0x0010, 0x0011, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016, 0x0017, 0x0018, 0x0019, 0x001A,
            0x001B, 0x0000,
        ];
        let mut rng = XorShift(SEED);
        let mut ok = 0u32;
        for i in 0..100_000u32 {
            let buf: Vec<u8> = match rng.below(5) {
                // Anything at all, of any length up to 300.
                0 => {
                    let mut v = vec![0u8; rng.below(301) as usize];
                    rng.fill(&mut v);
                    v
                }
                // A valid message with 1..=8 bits flipped.
                1 => {
                    let mut b = CmMad::new(rng.next(), random_msg(&mut rng)).encode().unwrap();
                    for _ in 0..=rng.below(8) {
                        let bit = rng.below(256 * 8) as usize;
                        b[bit / 8] ^= 1 << (bit % 8);
                    }
                    b.to_vec()
                }
                // A valid message truncated or extended.
                2 => {
                    let b = CmMad::new(rng.next(), random_msg(&mut rng)).encode().unwrap();
                    let mut v = b.to_vec();
                    if rng.next() & 1 == 1 {
                        v.truncate(rng.below(256) as usize);
                    } else {
                        for _ in 0..=rng.below(64) {
                            v.push(rng.byte());
                        }
                    }
                    v
                }
                // A valid CM header over random class data.
                3 => {
                    let attr = ATTRS[rng.below(ATTRS.len() as u64) as usize];
                    let mut b: Mad = rng.arr();
                    b[..24].copy_from_slice(&MadHeader::cm(rng.next(), attr).encode());
                    b.to_vec()
                }
                // A valid message with one random byte replaced.
                _ => {
                    let mut b = CmMad::new(rng.next(), random_msg(&mut rng)).encode().unwrap();
                    b[rng.below(256) as usize] = rng.byte();
                    b.to_vec()
                }
            };
            if let Ok(m) = CmMad::decode(&buf) {
                ok += 1;
                let again = m.encode().unwrap_or_else(|e| {
                    panic!("seed {SEED:#x} iter {i}: decoded MAD does not re-encode: {e}")
                });
                assert_eq!(CmMad::decode(&again).as_ref(), Ok(&m), "seed {SEED:#x} iter {i}");
                if let CmMessage::Req(r) = &m.msg {
                    check_split(&r.private_data, SEED, i);
                }
            }
            // The same bytes as REQ private data (zero padded / cut to 92 bytes).
            let mut pd = [0u8; REQ_PRIVATE_DATA_LEN];
            let n = buf.len().min(pd.len());
            pd[..n].copy_from_slice(&buf[..n]);
            if rng.next() & 1 == 1 {
                pd[0] = 0;
                pd[1] = 0x40 | (pd[1] & 0x0F);
            }
            check_split(&pd, SEED, i);
        }
        assert!(ok > 10_000, "seed {SEED:#x}: only {ok} buffers decoded; the fuzzer is too blunt");
    }

    fn check_split(pd: &[u8; REQ_PRIVATE_DATA_LEN], seed: u64, i: u32) {
        if let Ok((hdr, consumer)) = split_req_private_data(pd) {
            let rebuilt =
                req_private_data(&hdr, consumer).unwrap_or_else(|e| panic!("seed {seed:#x} iter {i}: {e}"));
            let (h2, c2) =
                split_req_private_data(&rebuilt).unwrap_or_else(|e| panic!("seed {seed:#x} iter {i}: {e}"));
            assert_eq!((h2, c2), (hdr, consumer), "seed {seed:#x} iter {i}");
        }
    }
}
