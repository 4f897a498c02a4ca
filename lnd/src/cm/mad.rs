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
//!
//! # Layout
//! This file has the header, the errors, [`CmMad`] and the field codecs; the REQ and its path
//! records are in `req`, the other six messages in `messages`, the enumerated fields in
//! `fields`; all are re-exported here.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::time::Duration;

use crate::fabric::types::Mad;

mod fields;
mod messages;
mod req;
pub use fields::{FailoverAccepted, MessageMraed, MessageRejected, RejReason, TransportType};
pub use messages::{Drep, Dreq, Mra, Rej, Rep, Rtu};
pub use req::{PathRecord, Req, RoceReqParams};

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
mod tests;
