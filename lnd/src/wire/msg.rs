//! o2iblnd messages (`kib_msg`): the 48-byte header, the per-type bodies, packing in place and
//! unpacking with every check `kiblnd_unpack_msg` makes.
//!
//! Header (`kib_msg`, 48 bytes, sender's byte order; magic and version identify the rest):
//!
//! | off | field | | off | field |
//! |---|---|---|---|---|
//! | 0 | `u32 ibm_magic` 0x0be91b91 | | 16 | `u64 ibm_srcnid` |
//! | 4 | `u16 ibm_version` 0x11/0x12 | | 24 | `u64 ibm_srcstamp` |
//! | 6 | `u8 ibm_type` | | 32 | `u64 ibm_dstnid` |
//! | 7 | `u8 ibm_credits` | | 40 | `u64 ibm_dststamp` |
//! | 8 | `u32 ibm_nob` (total) | | | |
//! | 12 | `u32 ibm_cksum` (0 = none) | | | |
//!
//! Bodies from offset 48:
//!
//! | type | body | size |
//! |---|---|---|
//! | CONNREQ 0xc0, CONNACK 0xc1 | [`ConnParams`] | 56 |
//! | NOOP 0xd0 | none | 48 |
//! | IMMEDIATE 0xd1 | LNet header (72), payload | 120..=4096 |
//! | PUT_REQ 0xd2 | LNet header, cookie | 128 |
//! | PUT_NAK 0xd3, PUT_DONE 0xd5, GET_DONE 0xd7 | cookie, `s32` status | 60 |
//! | PUT_ACK 0xd4 | src cookie, dst cookie, rdma_desc | 72 + 12n |
//! | GET_REQ 0xd6 | LNet header, cookie, rdma_desc | 136 + 12n |
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::fmt;

use lnet_shim::Nid;

use super::cksum::msg_cksum;
use super::rdma::{RdmaDesc, RdmaFrag, parse_rd, write_rd};
use super::{
    ByteOrder, CONN_PARAMS_SIZE, IBLND_CONNPARAMS_LEN, IBLND_MAX_IMMEDIATE, IBLND_MSG_MAGIC, IBLND_MSG_SIZE,
    IBLND_MSG_VERSION_1, IBLND_MSG_VERSION_2, LNET_HDR_SIZE, LNET_PROTO_MAGIC, MSG_HDR_SIZE,
    RDMA_DESC_HDR_SIZE, WireError, get_cookie, put_cookie,
};

/// Where the body starts.
const BODY: usize = MSG_HDR_SIZE;
/// Where an IMMEDIATE payload starts (after the LNet header).
const IMM_PAYLOAD: usize = BODY + LNET_HDR_SIZE;
/// PUT_REQ/GET_REQ cookie offset (after the LNet header).
const REQ_COOKIE: usize = BODY + LNET_HDR_SIZE;
/// GET_REQ descriptor offset.
const GET_RD: usize = REQ_COOKIE + 8;
/// PUT_ACK src/dst cookies and descriptor.
const PUTACK_SRC: usize = BODY;
const PUTACK_DST: usize = BODY + 8;
const PUTACK_RD: usize = BODY + 16;
/// Size of `kib_completion_msg`.
const COMPLETION_SIZE: usize = 12;

/// The message header as laid out on the wire.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RawHdr {
    magic: [u8; 4],
    version: [u8; 2],
    msg_type: u8,
    credits: u8,
    nob: [u8; 4],
    cksum: [u8; 4],
    srcnid: [u8; 8],
    srcstamp: [u8; 8],
    dstnid: [u8; 8],
    dststamp: [u8; 8],
}

/// `kib_connparams` as laid out on the wire.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct RawConnParams {
    queue_depth: [u8; 2],
    max_frags: [u8; 2],
    max_msg_size: [u8; 4],
}

/// `kib_completion_msg` as laid out on the wire.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RawCompletion {
    cookie: [u8; 8],
    status: [u8; 4],
}

const _: () = assert!(size_of::<RawHdr>() == MSG_HDR_SIZE);
const _: () = assert!(size_of::<RawConnParams>() == CONN_PARAMS_SIZE);
const _: () = assert!(size_of::<RawCompletion>() == COMPLETION_SIZE);
const _: () = assert!(IBLND_CONNPARAMS_LEN == MSG_HDR_SIZE + CONN_PARAMS_SIZE);

/// o2iblnd message types (`IBLND_MSG_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum MsgType {
    /// `IBLND_MSG_CONNREQ` (0xc0): connection request, CM REQ private data.
    ConnReq = 0xc0,
    /// `IBLND_MSG_CONNACK` (0xc1): connection acknowledge, CM REP private data.
    ConnAck = 0xc1,
    /// `IBLND_MSG_NOOP` (0xd0): nothing but returned credits (or a keepalive).
    Noop = 0xd0,
    /// `IBLND_MSG_IMMEDIATE` (0xd1): LNet header and a copied payload.
    Immediate = 0xd1,
    /// `IBLND_MSG_PUT_REQ` (0xd2): PUT source to sink, LNet header and the source's cookie.
    PutReq = 0xd2,
    /// `IBLND_MSG_PUT_NAK` (0xd3): completion, sink to source: the sink will not take the PUT.
    PutNak = 0xd3,
    /// `IBLND_MSG_PUT_ACK` (0xd4): sink to source, the sink's buffer to RDMA-write into.
    PutAck = 0xd4,
    /// `IBLND_MSG_PUT_DONE` (0xd5): completion, source to sink, after the RDMA.
    PutDone = 0xd5,
    /// `IBLND_MSG_GET_REQ` (0xd6): GET requester (sink) to responder, LNet header, cookie and
    /// the sink buffer for the reply.
    GetReq = 0xd6,
    /// `IBLND_MSG_GET_DONE` (0xd7): completion, responder to requester, after the RDMA.
    GetDone = 0xd7,
}

impl MsgType {
    /// Every message type, in wire-value order.
    pub const ALL: [MsgType; 10] = [
        MsgType::ConnReq,
        MsgType::ConnAck,
        MsgType::Noop,
        MsgType::Immediate,
        MsgType::PutReq,
        MsgType::PutNak,
        MsgType::PutAck,
        MsgType::PutDone,
        MsgType::GetReq,
        MsgType::GetDone,
    ];

    /// The type of a wire value, if o2iblnd defines it.
    pub const fn from_u8(v: u8) -> Option<MsgType> {
        match v {
            0xc0 => Some(MsgType::ConnReq),
            0xc1 => Some(MsgType::ConnAck),
            0xd0 => Some(MsgType::Noop),
            0xd1 => Some(MsgType::Immediate),
            0xd2 => Some(MsgType::PutReq),
            0xd3 => Some(MsgType::PutNak),
            0xd4 => Some(MsgType::PutAck),
            0xd5 => Some(MsgType::PutDone),
            0xd6 => Some(MsgType::GetReq),
            0xd7 => Some(MsgType::GetDone),
            _ => None,
        }
    }

    /// The wire value (`ibm_type`).
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The name o2iblnd logs (`kiblnd_msgtype2str`): `CONNREQ`, `PUT_ACK`, ...
    pub const fn name(self) -> &'static str {
        match self {
            MsgType::ConnReq => "CONNREQ",
            MsgType::ConnAck => "CONNACK",
            MsgType::Noop => "NOOP",
            MsgType::Immediate => "IMMEDIATE",
            MsgType::PutReq => "PUT_REQ",
            MsgType::PutNak => "PUT_NAK",
            MsgType::PutAck => "PUT_ACK",
            MsgType::PutDone => "PUT_DONE",
            MsgType::GetReq => "GET_REQ",
            MsgType::GetDone => "GET_DONE",
        }
    }

    /// The smallest valid message of this type, header included (`kiblnd_msgtype2size`): an
    /// IMMEDIATE without payload, a PUT_ACK/GET_REQ descriptor without fragments.
    pub const fn min_size(self) -> usize {
        match self {
            MsgType::ConnReq | MsgType::ConnAck => IBLND_CONNPARAMS_LEN,
            MsgType::Noop => MSG_HDR_SIZE,
            MsgType::Immediate => IMM_PAYLOAD,
            MsgType::PutReq => REQ_COOKIE + 8,
            MsgType::PutNak | MsgType::PutDone | MsgType::GetDone => BODY + COMPLETION_SIZE,
            MsgType::PutAck => PUTACK_RD + RDMA_DESC_HDR_SIZE,
            MsgType::GetReq => GET_RD + RDMA_DESC_HDR_SIZE,
        }
    }

    /// Whether the body carries an RDMA descriptor (PUT_ACK, GET_REQ).
    pub const fn has_rdma_desc(self) -> bool {
        matches!(self, MsgType::PutAck | MsgType::GetReq)
    }

    /// Whether the body is a `kib_completion_msg` (PUT_NAK, PUT_DONE, GET_DONE).
    pub const fn is_completion(self) -> bool {
        matches!(self, MsgType::PutNak | MsgType::PutDone | MsgType::GetDone)
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Size of a PUT_ACK carrying `nfrags` fragments: 72 + 12n.
pub const fn putack_nob(nfrags: usize) -> usize {
    MsgType::PutAck.min_size() + nfrags * super::RDMA_FRAG_SIZE
}

/// Size of a GET_REQ carrying `nfrags` fragments: 136 + 12n.
pub const fn get_nob(nfrags: usize) -> usize {
    MsgType::GetReq.min_size() + nfrags * super::RDMA_FRAG_SIZE
}

/// Connection parameters (`kib_connparams`): the body of CONNREQ and CONNACK, and part of a
/// reject.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnParams {
    /// Queue depth Q: credits and reserved credits each side starts with (`ibcp_queue_depth`).
    pub queue_depth: u16,
    /// Most RDMA fragments per descriptor (`ibcp_max_frags`), 257 normally.
    pub max_frags: u16,
    /// Largest message, 4096 (`ibcp_max_msg_size`).
    pub max_msg_size: u32,
}

impl ConnParams {
    /// The 8 wire bytes in `order` (the LND sends [`ByteOrder::NATIVE`]).
    pub fn encode(&self, order: ByteOrder) -> [u8; CONN_PARAMS_SIZE] {
        bytemuck::cast(self.to_raw(order))
    }

    /// Parameters from their 8 wire bytes, sent in `order`.
    pub fn decode(bytes: [u8; CONN_PARAMS_SIZE], order: ByteOrder) -> ConnParams {
        ConnParams::from_raw(&bytemuck::cast(bytes), order)
    }

    pub(crate) fn to_raw(self, order: ByteOrder) -> RawConnParams {
        RawConnParams {
            queue_depth: order.put_u16(self.queue_depth),
            max_frags: order.put_u16(self.max_frags),
            max_msg_size: order.put_u32(self.max_msg_size),
        }
    }

    pub(crate) fn from_raw(raw: &RawConnParams, order: ByteOrder) -> ConnParams {
        ConnParams {
            queue_depth: order.get_u16(raw.queue_depth),
            max_frags: order.get_u16(raw.max_frags),
            max_msg_size: order.get_u32(raw.max_msg_size),
        }
    }
}

/// The message header (`kib_msg` up to `ibm_u`), in native order. The magic is implied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MsgHeader {
    /// Protocol version (`ibm_version`): 0x11 or 0x12.
    pub version: u16,
    /// Message type (`ibm_type`).
    pub msg_type: MsgType,
    /// Credits returned to the peer (`ibm_credits`).
    pub credits: u8,
    /// Total bytes, header included (`ibm_nob`).
    pub nob: u32,
    /// Checksum as received (`ibm_cksum`, 0 = none). [`pack_header`] ignores it and writes its
    /// own.
    pub cksum: u32,
    /// Sender's NID (`ibm_srcnid`).
    pub srcnid: Nid,
    /// Sender's incarnation (`ibm_srcstamp`).
    pub srcstamp: u64,
    /// Destination NID (`ibm_dstnid`).
    pub dstnid: Nid,
    /// Destination incarnation as the sender knows it (`ibm_dststamp`; 0 in a CONNREQ to a
    /// peer not met before).
    pub dststamp: u64,
}

/// IMMEDIATE body (`kib_immediate_msg`): an LNet header and a piggy-backed payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmediateMsg<'a> {
    /// The LNet header, opaque and always little-endian (`ibim_hdr`).
    pub lnet_hdr: &'a [u8; LNET_HDR_SIZE],
    /// The payload: the bytes after the LNet header up to `ibm_nob` (`ibim_payload`).
    pub payload: &'a [u8],
}

/// PUT_REQ body (`kib_putreq_msg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutReqMsg<'a> {
    /// The LNet header, opaque and always little-endian (`ibprm_hdr`).
    pub lnet_hdr: &'a [u8; LNET_HDR_SIZE],
    /// The source's completion cookie, echoed in PUT_ACK/PUT_NAK (`ibprm_cookie`; opaque,
    /// never byte-swapped).
    pub cookie: u64,
}

/// PUT_ACK body (`kib_putack_msg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutAckMsg<'a> {
    /// The source's cookie from the PUT_REQ, reflected (`ibpam_src_cookie`; never swapped).
    pub src_cookie: u64,
    /// The sink's cookie, echoed in PUT_DONE (`ibpam_dst_cookie`; never swapped).
    pub dst_cookie: u64,
    /// The sink's buffer (`ibpam_rd`).
    pub rd: RdmaDesc<'a>,
}

/// GET_REQ body (`kib_get_msg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetMsg<'a> {
    /// The LNet header, opaque and always little-endian (`ibgm_hdr`).
    pub lnet_hdr: &'a [u8; LNET_HDR_SIZE],
    /// The requester's cookie, echoed in GET_DONE (`ibgm_cookie`; never swapped).
    pub cookie: u64,
    /// The requester's sink buffer for the reply (`ibgm_rd`).
    pub rd: RdmaDesc<'a>,
}

/// PUT_NAK, PUT_DONE and GET_DONE body (`kib_completion_msg`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CompletionMsg {
    /// The cookie of the transaction completed (`ibcm_cookie`; never swapped).
    pub cookie: u64,
    /// Bytes transferred if `>= 0`, else `-errno` (`ibcm_status`).
    pub status: i32,
}

/// A message body by type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgBody<'a> {
    /// CONNREQ: the requester's parameters.
    ConnReq(ConnParams),
    /// CONNACK: the parameters accepted.
    ConnAck(ConnParams),
    /// NOOP: no body.
    Noop,
    /// IMMEDIATE.
    Immediate(ImmediateMsg<'a>),
    /// PUT_REQ.
    PutReq(PutReqMsg<'a>),
    /// PUT_NAK.
    PutNak(CompletionMsg),
    /// PUT_ACK.
    PutAck(PutAckMsg<'a>),
    /// PUT_DONE.
    PutDone(CompletionMsg),
    /// GET_REQ.
    GetReq(GetMsg<'a>),
    /// GET_DONE.
    GetDone(CompletionMsg),
}

impl MsgBody<'_> {
    /// The message type this body belongs to.
    pub const fn msg_type(&self) -> MsgType {
        match self {
            MsgBody::ConnReq(_) => MsgType::ConnReq,
            MsgBody::ConnAck(_) => MsgType::ConnAck,
            MsgBody::Noop => MsgType::Noop,
            MsgBody::Immediate(_) => MsgType::Immediate,
            MsgBody::PutReq(_) => MsgType::PutReq,
            MsgBody::PutNak(_) => MsgType::PutNak,
            MsgBody::PutAck(_) => MsgType::PutAck,
            MsgBody::PutDone(_) => MsgType::PutDone,
            MsgBody::GetReq(_) => MsgType::GetReq,
            MsgBody::GetDone(_) => MsgType::GetDone,
        }
    }

    /// Total message bytes with this body, header included (may exceed 4096 for an oversized
    /// IMMEDIATE payload, which encoding then refuses).
    pub fn nob(&self) -> usize {
        match self {
            MsgBody::Immediate(m) => IMM_PAYLOAD.saturating_add(m.payload.len()),
            MsgBody::PutAck(m) => PUTACK_RD.saturating_add(m.rd.wire_size()),
            MsgBody::GetReq(m) => GET_RD.saturating_add(m.rd.wire_size()),
            other => other.msg_type().min_size(),
        }
    }
}

/// A whole message, header and body in native order: what [`unpack`] returns (borrowing the
/// receive buffer), or one built with [`Msg::new`] to [`encode`](Msg::encode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Msg<'a> {
    /// The byte order the message was sent in (kept as the clue to the peer's endianness,
    /// like o2iblnd's unflipped magic); [`Msg::encode`] packs in this order.
    pub order: ByteOrder,
    /// The header.
    pub hdr: MsgHeader,
    /// The body.
    pub body: MsgBody<'a>,
}

impl<'a> Msg<'a> {
    /// A message to send in native order; `hdr.msg_type` and `hdr.nob` are set from `body`
    /// (`nob` saturates at `u32::MAX` for an oversized body, which encoding refuses).
    pub fn new(hdr: MsgHeader, body: MsgBody<'a>) -> Msg<'a> {
        let nob = u32::try_from(body.nob()).unwrap_or(u32::MAX);
        Msg { order: ByteOrder::NATIVE, hdr: MsgHeader { msg_type: body.msg_type(), nob, ..hdr }, body }
    }

    /// Packs the whole message into `buf` in `self.order` (a convenience for tests and
    /// simulations; the LND uses the `init_*` writers and [`pack_header`]). The type and length
    /// come from the body; `hdr.msg_type`, `hdr.nob` and `hdr.cksum` are not consulted. With
    /// `with_cksum` the checksum is computed and written, else 0. Returns the bytes written.
    pub fn encode(&self, buf: &mut [u8], with_cksum: bool) -> Result<u32, WireError> {
        let order = self.order;
        let nob = match &self.body {
            MsgBody::ConnReq(cp) | MsgBody::ConnAck(cp) => write_connparams(buf, cp, order)?,
            MsgBody::Noop => init_noop(buf)?,
            MsgBody::Immediate(m) => {
                let nob = immediate_nob(m.payload.len())?;
                let area = init_immediate(buf, m.lnet_hdr)?;
                let have = area.len();
                area.get_mut(..m.payload.len())
                    .ok_or(WireError::BufferTooSmall { need: nob as usize, have: IMM_PAYLOAD + have })?
                    .copy_from_slice(m.payload);
                nob
            }
            MsgBody::PutReq(m) => init_putreq(buf, m.lnet_hdr, m.cookie)?,
            MsgBody::PutAck(m) => write_putack(buf, m.src_cookie, m.dst_cookie, &m.rd, order)?,
            MsgBody::GetReq(m) => write_get(buf, m.lnet_hdr, m.cookie, &m.rd, order)?,
            MsgBody::PutNak(c) | MsgBody::PutDone(c) | MsgBody::GetDone(c) => {
                write_completion(buf, c, order)?
            }
        };
        let hdr = MsgHeader { msg_type: self.body.msg_type(), nob, ..self.hdr };
        pack_header_in(buf, &hdr, with_cksum, order)?;
        Ok(nob)
    }
}

/// The body area `buf[48..need]`, or why not.
fn body_mut(buf: &mut [u8], need: usize) -> Result<&mut [u8], WireError> {
    let have = buf.len();
    buf.get_mut(BODY..need).ok_or(WireError::BufferTooSmall { need, have })
}

/// `need` as an `ibm_nob` (every caller passes at most 4096).
fn nob32(need: usize) -> u32 {
    u32::try_from(need).unwrap_or(u32::MAX)
}

/// Body writer for a NOOP: there is no body, so this only checks `buf` can hold the header.
/// Returns the message size, 48. Like every `init_*` writer it touches only the body
/// (`buf[48..nob]`); [`pack_header`] writes the header at post time.
pub fn init_noop(buf: &mut [u8]) -> Result<u32, WireError> {
    let need = MsgType::Noop.min_size();
    body_mut(buf, need)?;
    Ok(nob32(need))
}

/// Body writer for CONNREQ and CONNACK: writes `cp` at `buf[48..56]`; returns 56.
pub fn init_connparams(buf: &mut [u8], cp: &ConnParams) -> Result<u32, WireError> {
    write_connparams(buf, cp, ByteOrder::NATIVE)
}

fn write_connparams(buf: &mut [u8], cp: &ConnParams, order: ByteOrder) -> Result<u32, WireError> {
    let need = MsgType::ConnReq.min_size();
    body_mut(buf, need)?.copy_from_slice(&cp.encode(order));
    Ok(nob32(need))
}

/// Body writer for IMMEDIATE: writes the LNet header at `buf[48..120]` and returns the payload
/// area `buf[120..]` (at most [`IBLND_MAX_IMMEDIATE`] bytes, fewer if `buf` is shorter than
/// 4096). The caller copies the payload there, possibly from several fragments, then gets the
/// message size from [`immediate_nob`].
pub fn init_immediate<'b>(
    buf: &'b mut [u8],
    lnet_hdr: &[u8; LNET_HDR_SIZE],
) -> Result<&'b mut [u8], WireError> {
    let have = buf.len();
    let (hdr_area, payload) = buf
        .get_mut(BODY..have.min(IBLND_MSG_SIZE))
        .and_then(|b| b.split_at_mut_checked(LNET_HDR_SIZE))
        .ok_or(WireError::BufferTooSmall { need: IMM_PAYLOAD, have })?;
    hdr_area.copy_from_slice(lnet_hdr);
    Ok(payload)
}

/// Size of an IMMEDIATE with `payload_len` payload bytes: 120 + `payload_len`; fails past
/// [`IBLND_MAX_IMMEDIATE`] (3976).
pub fn immediate_nob(payload_len: usize) -> Result<u32, WireError> {
    if payload_len > IBLND_MAX_IMMEDIATE {
        return Err(WireError::PayloadTooLarge { len: payload_len });
    }
    Ok(nob32(IMM_PAYLOAD + payload_len))
}

/// Body writer for PUT_REQ: the LNet header and the source's cookie; returns 128.
pub fn init_putreq(buf: &mut [u8], lnet_hdr: &[u8; LNET_HDR_SIZE], cookie: u64) -> Result<u32, WireError> {
    let need = MsgType::PutReq.min_size();
    let have = buf.len();
    let body = body_mut(buf, need)?;
    let (hdr_area, cookie_area) =
        body.split_at_mut_checked(LNET_HDR_SIZE).ok_or(WireError::BufferTooSmall { need, have })?;
    hdr_area.copy_from_slice(lnet_hdr);
    cookie_area.copy_from_slice(&put_cookie(cookie));
    Ok(nob32(need))
}

/// Body writer for PUT_ACK: the reflected source cookie, the sink's cookie and the sink buffer
/// (`key`, 1..=257 `frags`); returns 72 + 12 × `frags.len()`.
pub fn init_putack(
    buf: &mut [u8],
    src_cookie: u64,
    dst_cookie: u64,
    key: u32,
    frags: &[RdmaFrag],
) -> Result<u32, WireError> {
    write_putack(buf, src_cookie, dst_cookie, &RdmaDesc::new(key, frags), ByteOrder::NATIVE)
}

fn write_putack(
    buf: &mut [u8],
    src_cookie: u64,
    dst_cookie: u64,
    rd: &RdmaDesc<'_>,
    order: ByteOrder,
) -> Result<u32, WireError> {
    let need = PUTACK_RD + rd.wire_size();
    let have = buf.len();
    let body = body_mut(buf, need)?;
    let (cookies, rd_area) =
        body.split_at_mut_checked(PUTACK_RD - BODY).ok_or(WireError::BufferTooSmall { need, have })?;
    let (src, dst) = cookies
        .split_at_mut_checked(PUTACK_DST - PUTACK_SRC)
        .ok_or(WireError::BufferTooSmall { need, have })?;
    src.copy_from_slice(&put_cookie(src_cookie));
    dst.copy_from_slice(&put_cookie(dst_cookie));
    write_rd(rd_area, rd, order)?;
    Ok(nob32(need))
}

/// Body writer for GET_REQ: the LNet header, the requester's cookie and its sink buffer
/// (`key`, 1..=257 `frags`); returns 136 + 12 × `frags.len()`.
pub fn init_get(
    buf: &mut [u8],
    lnet_hdr: &[u8; LNET_HDR_SIZE],
    cookie: u64,
    key: u32,
    frags: &[RdmaFrag],
) -> Result<u32, WireError> {
    write_get(buf, lnet_hdr, cookie, &RdmaDesc::new(key, frags), ByteOrder::NATIVE)
}

fn write_get(
    buf: &mut [u8],
    lnet_hdr: &[u8; LNET_HDR_SIZE],
    cookie: u64,
    rd: &RdmaDesc<'_>,
    order: ByteOrder,
) -> Result<u32, WireError> {
    let need = GET_RD + rd.wire_size();
    let have = buf.len();
    let body = body_mut(buf, need)?;
    let (hdr_area, rest) =
        body.split_at_mut_checked(LNET_HDR_SIZE).ok_or(WireError::BufferTooSmall { need, have })?;
    let (cookie_area, rd_area) =
        rest.split_at_mut_checked(8).ok_or(WireError::BufferTooSmall { need, have })?;
    hdr_area.copy_from_slice(lnet_hdr);
    cookie_area.copy_from_slice(&put_cookie(cookie));
    write_rd(rd_area, rd, order)?;
    Ok(nob32(need))
}

/// Body writer for PUT_NAK, PUT_DONE and GET_DONE: the peer's cookie and the status (bytes if
/// `>= 0`, else `-errno`); returns 60.
pub fn init_completion(buf: &mut [u8], cookie: u64, status: i32) -> Result<u32, WireError> {
    write_completion(buf, &CompletionMsg { cookie, status }, ByteOrder::NATIVE)
}

fn write_completion(buf: &mut [u8], c: &CompletionMsg, order: ByteOrder) -> Result<u32, WireError> {
    let need = MsgType::GetDone.min_size();
    let raw = RawCompletion { cookie: put_cookie(c.cookie), status: order.put_u32(c.status as u32) };
    body_mut(buf, need)?.copy_from_slice(bytemuck::bytes_of(&raw));
    Ok(nob32(need))
}

/// `kiblnd_pack_msg`: writes the 48-byte header into `buf[..48]` at post time, with the
/// magic, `hdr`'s version, type, credits, `nob`, NIDs and stamps, in native order. The body
/// must already be in `buf[48..hdr.nob]`. With `with_cksum` (tunable `cksum`) the checksum over
/// `buf[..hdr.nob]` (its own field as zero) is written, else 0; `hdr.cksum` is ignored.
/// Returns the checksum written. Fails if `hdr.nob` is below 48, above 4096 or past `buf`.
pub fn pack_header(buf: &mut [u8], hdr: &MsgHeader, with_cksum: bool) -> Result<u32, WireError> {
    pack_header_in(buf, hdr, with_cksum, ByteOrder::NATIVE)
}

fn pack_header_in(
    buf: &mut [u8],
    hdr: &MsgHeader,
    with_cksum: bool,
    order: ByteOrder,
) -> Result<u32, WireError> {
    let nob = usize::try_from(hdr.nob).unwrap_or(usize::MAX);
    if nob < MSG_HDR_SIZE {
        return Err(WireError::NobTooSmall { nob: hdr.nob });
    }
    if nob > IBLND_MSG_SIZE {
        return Err(WireError::TooLong { nob: hdr.nob });
    }
    let have = buf.len();
    let too_small = WireError::BufferTooSmall { need: nob, have };
    let msg = buf.get_mut(..nob).ok_or(too_small)?;
    let raw = RawHdr {
        magic: order.put_u32(IBLND_MSG_MAGIC),
        version: order.put_u16(hdr.version),
        msg_type: hdr.msg_type.as_u8(),
        credits: hdr.credits,
        nob: order.put_u32(hdr.nob),
        cksum: [0; 4],
        srcnid: order.put_u64(hdr.srcnid.as_u64()),
        srcstamp: order.put_u64(hdr.srcstamp),
        dstnid: order.put_u64(hdr.dstnid.as_u64()),
        dststamp: order.put_u64(hdr.dststamp),
    };
    msg.get_mut(..MSG_HDR_SIZE).ok_or(too_small)?.copy_from_slice(bytemuck::bytes_of(&raw));
    if !with_cksum {
        return Ok(0);
    }
    let sum = msg_cksum(msg);
    let raw: &mut RawHdr =
        msg.get_mut(..MSG_HDR_SIZE).and_then(|h| bytemuck::try_from_bytes_mut(h).ok()).ok_or(too_small)?;
    raw.cksum = order.put_u32(sum);
    Ok(sum)
}

/// `kiblnd_unpack_msg`: decodes a received message (`buf` = the bytes received, which may
/// extend past the message) in either byte order, making every check in this order:
/// at least 6 bytes, magic (`LNET_PROTO_MAGIC` reported apart), version 1 or 2, at least 48
/// bytes, 48 <= `ibm_nob` <= received and <= 4096, checksum if non-zero, source NID not
/// `LNET_NID_ANY`, known type, `ibm_nob` covers the type's fixed body, and for PUT_ACK/GET_REQ
/// 0 < nfrags <= 257 with every fragment inside `ibm_nob`. The result borrows `buf`.
pub fn unpack(buf: &[u8]) -> Result<Msg<'_>, WireError> {
    let len = buf.len();
    let too_short = WireError::TooShort { len };
    let magic: [u8; 4] = array_at(buf, 0).ok_or(too_short)?;
    let version: [u8; 2] = array_at(buf, 4).ok_or(too_short)?;
    if ByteOrder::of_magic(magic, LNET_PROTO_MAGIC).is_some() {
        return Err(WireError::SocklndMagic);
    }
    let order = ByteOrder::of_magic(magic, IBLND_MSG_MAGIC)
        .ok_or(WireError::BadMagic { magic: u32::from_le_bytes(magic) })?;
    let version = order.get_u16(version);
    if version != IBLND_MSG_VERSION_2 && version != IBLND_MSG_VERSION_1 {
        return Err(WireError::BadVersion { version });
    }
    let raw: &RawHdr =
        buf.get(..MSG_HDR_SIZE).and_then(|h| bytemuck::try_from_bytes(h).ok()).ok_or(too_short)?;
    let nob = order.get_u32(raw.nob);
    let n = usize::try_from(nob).unwrap_or(usize::MAX);
    if n < MSG_HDR_SIZE {
        return Err(WireError::NobTooSmall { nob });
    }
    let msg = buf.get(..n).ok_or(WireError::NobExceedsReceived { nob, received: len })?;
    if n > IBLND_MSG_SIZE {
        return Err(WireError::TooLong { nob });
    }
    let cksum = order.get_u32(raw.cksum);
    if cksum != 0 {
        let computed = msg_cksum(msg);
        if computed != cksum {
            return Err(WireError::BadChecksum { wire: cksum, computed });
        }
    }
    let srcnid = Nid::from_u64(order.get_u64(raw.srcnid));
    if srcnid.is_any() {
        return Err(WireError::SrcNidAny);
    }
    let msg_type = MsgType::from_u8(raw.msg_type).ok_or(WireError::UnknownType { msg_type: raw.msg_type })?;
    let need = msg_type.min_size();
    let short = WireError::BodyTooShort { msg_type, nob, need };
    if n < need {
        return Err(short);
    }
    let hdr = MsgHeader {
        version,
        msg_type,
        credits: raw.credits,
        nob,
        cksum,
        srcnid,
        srcstamp: order.get_u64(raw.srcstamp),
        dstnid: Nid::from_u64(order.get_u64(raw.dstnid)),
        dststamp: order.get_u64(raw.dststamp),
    };
    let lnet_hdr = || -> Result<&[u8; LNET_HDR_SIZE], WireError> {
        msg.get(BODY..IMM_PAYLOAD).and_then(|h| h.try_into().ok()).ok_or(short)
    };
    let cookie = |off: usize| array_at(msg, off).map(get_cookie).ok_or(short);
    let rd = |off: usize| match msg.get(off..) {
        Some(rd) => parse_rd(rd, order, msg_type, off),
        None => Err(short),
    };
    let body = match msg_type {
        MsgType::ConnReq | MsgType::ConnAck => {
            let raw: &RawConnParams = msg
                .get(BODY..BODY + CONN_PARAMS_SIZE)
                .and_then(|b| bytemuck::try_from_bytes(b).ok())
                .ok_or(short)?;
            let cp = ConnParams::from_raw(raw, order);
            if msg_type == MsgType::ConnReq { MsgBody::ConnReq(cp) } else { MsgBody::ConnAck(cp) }
        }
        MsgType::Noop => MsgBody::Noop,
        MsgType::Immediate => MsgBody::Immediate(ImmediateMsg {
            lnet_hdr: lnet_hdr()?,
            payload: msg.get(IMM_PAYLOAD..).ok_or(short)?,
        }),
        MsgType::PutReq => MsgBody::PutReq(PutReqMsg { lnet_hdr: lnet_hdr()?, cookie: cookie(REQ_COOKIE)? }),
        MsgType::PutAck => MsgBody::PutAck(PutAckMsg {
            src_cookie: cookie(PUTACK_SRC)?,
            dst_cookie: cookie(PUTACK_DST)?,
            rd: rd(PUTACK_RD)?,
        }),
        MsgType::GetReq => {
            MsgBody::GetReq(GetMsg { lnet_hdr: lnet_hdr()?, cookie: cookie(REQ_COOKIE)?, rd: rd(GET_RD)? })
        }
        MsgType::PutNak | MsgType::PutDone | MsgType::GetDone => {
            let raw: &RawCompletion = msg
                .get(BODY..BODY + COMPLETION_SIZE)
                .and_then(|b| bytemuck::try_from_bytes(b).ok())
                .ok_or(short)?;
            let c =
                CompletionMsg { cookie: get_cookie(raw.cookie), status: order.get_u32(raw.status) as i32 };
            match msg_type {
                MsgType::PutNak => MsgBody::PutNak(c),
                MsgType::PutDone => MsgBody::PutDone(c),
                _ => MsgBody::GetDone(c),
            }
        }
    };
    Ok(Msg { order, hdr, body })
}

/// `N` bytes at `off`, if present.
fn array_at<const N: usize>(buf: &[u8], off: usize) -> Option<[u8; N]> {
    buf.get(off..off.checked_add(N)?)?.try_into().ok()
}

/// Who a connection's messages must come from and be addressed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnIdentity {
    /// The peer's NID (`ibp_nid`).
    pub peer_nid: Nid,
    /// The peer's incarnation when the connection was made (`ibc_incarnation`).
    pub peer_incarnation: u64,
    /// This NI's NID (`ni_nid`).
    pub my_nid: Nid,
    /// This NI's incarnation (`ibn_incarnation`).
    pub my_incarnation: u64,
}

/// The per-connection check every received message passes (`kiblnd_rx_complete`): source NID
/// = the peer, destination NID = this NI, source stamp = the peer's incarnation, destination
/// stamp = mine. A failure is one of the `Stale*` errors ([`WireError::is_stale`]): `-ESTALE`,
/// close the connection.
pub fn check_conn(hdr: &MsgHeader, conn: &ConnIdentity) -> Result<(), WireError> {
    if hdr.srcnid != conn.peer_nid {
        return Err(WireError::StaleSrcNid { got: hdr.srcnid, expected: conn.peer_nid });
    }
    if hdr.dstnid != conn.my_nid {
        return Err(WireError::StaleDstNid { got: hdr.dstnid, expected: conn.my_nid });
    }
    if hdr.srcstamp != conn.peer_incarnation {
        return Err(WireError::StaleSrcStamp { got: hdr.srcstamp, expected: conn.peer_incarnation });
    }
    if hdr.dststamp != conn.my_incarnation {
        return Err(WireError::StaleDstStamp { got: hdr.dststamp, expected: conn.my_incarnation });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::cksum::cksum;
    use crate::wire::{IBLND_MAX_RDMA_FRAGS, RDMA_FRAG_SIZE};

    /// 10.0.0.1@o2ib
    const SRC: Nid = Nid::from_u64(0x0005_0000_0a00_0001);
    /// 10.0.0.2@o2ib
    const DST: Nid = Nid::from_u64(0x0005_0000_0a00_0002);

    fn hdr(credits: u8) -> MsgHeader {
        MsgHeader {
            version: IBLND_MSG_VERSION_2,
            msg_type: MsgType::Noop,
            credits,
            nob: 0,
            cksum: 0,
            srcnid: SRC,
            srcstamp: 0x0102_0304_0506_0708,
            dstnid: DST,
            dststamp: 0x1112_1314_1516_1718,
        }
    }

    fn lnet_hdr() -> [u8; LNET_HDR_SIZE] {
        std::array::from_fn(|i| (i as u8).wrapping_mul(7) ^ 0xa5)
    }

    fn frags(n: usize) -> Vec<RdmaFrag> {
        (0..n).map(|i| RdmaFrag::new(0x7f00_0000_0000 + 0x1_0000 * i as u64 + 12, 4096 - i as u32)).collect()
    }

    /// One message of every type (PUT_ACK/GET_REQ with `rd`'s fragments).
    fn samples<'a>(lh: &'a [u8; 72], payload: &'a [u8], rd: &'a [RdmaFrag]) -> Vec<Msg<'a>> {
        let cp = ConnParams { queue_depth: 32, max_frags: 257, max_msg_size: 4096 };
        let rd = RdmaDesc::new(0x0bad_cafe, rd);
        let bodies = [
            MsgBody::ConnReq(cp),
            MsgBody::ConnAck(ConnParams { queue_depth: 8, ..cp }),
            MsgBody::Noop,
            MsgBody::Immediate(ImmediateMsg { lnet_hdr: lh, payload }),
            MsgBody::PutReq(PutReqMsg { lnet_hdr: lh, cookie: 0x1122_3344_5566_7788 }),
            MsgBody::PutNak(CompletionMsg { cookie: 7, status: -12 }),
            MsgBody::PutAck(PutAckMsg { src_cookie: 0x1122_3344_5566_7788, dst_cookie: 0x99, rd }),
            MsgBody::PutDone(CompletionMsg { cookie: 0x99, status: 1 << 20 }),
            MsgBody::GetReq(GetMsg { lnet_hdr: lh, cookie: u64::MAX - 3, rd }),
            MsgBody::GetDone(CompletionMsg { cookie: u64::MAX - 3, status: -61 }),
        ];
        bodies.into_iter().enumerate().map(|(i, b)| Msg::new(hdr(i as u8), b)).collect()
    }

    // ---- hand-checked byte images (little-endian, as sent) ----

    #[test]
    fn noop_byte_image() {
        let mut buf = [0xeeu8; 64];
        let nob = init_noop(&mut buf).unwrap();
        assert_eq!(nob, 48);
        let h = MsgHeader { msg_type: MsgType::Noop, nob, ..hdr(3) };
        assert_eq!(pack_header(&mut buf, &h, false), Ok(0));
        #[rustfmt::skip]
        let want: [u8; 48] = [
            0x91, 0x1b, 0xe9, 0x0b,                         //  0 magic 0x0be91b91
            0x12, 0x00,                                     //  4 version V2
            0xd0,                                           //  6 type NOOP
            0x03,                                           //  7 credits 3
            0x30, 0x00, 0x00, 0x00,                         //  8 nob 48
            0x00, 0x00, 0x00, 0x00,                         // 12 cksum: none
            0x01, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00, // 16 srcnid 10.0.0.1@o2ib
            0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // 24 srcstamp
            0x02, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00, // 32 dstnid 10.0.0.2@o2ib
            0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, // 40 dststamp
        ];
        assert_eq!(buf[..48], want);
        assert_eq!(buf[48..], [0xee; 16], "nothing written past nob");
        let m = unpack(&want).unwrap();
        assert_eq!(m, Msg::new(h, MsgBody::Noop));
    }

    #[test]
    fn connreq_byte_image() {
        let cp = ConnParams { queue_depth: 8, max_frags: 257, max_msg_size: 4096 };
        let h = MsgHeader {
            version: IBLND_MSG_VERSION_2,
            msg_type: MsgType::ConnReq,
            credits: 0,
            nob: 56,
            cksum: 0,
            srcnid: "192.168.1.2@o2ib".parse().unwrap(),
            srcstamp: 0x0005_f1e2_d3c4_b5a6,
            dstnid: "192.168.1.3@o2ib1".parse().unwrap(),
            dststamp: 0, // peer's incarnation not known yet
        };
        let mut buf = [0u8; IBLND_CONNPARAMS_LEN];
        assert_eq!(init_connparams(&mut buf, &cp), Ok(56));
        pack_header(&mut buf, &h, false).unwrap();
        #[rustfmt::skip]
        let want: [u8; 56] = [
            0x91, 0x1b, 0xe9, 0x0b,                         //  0 magic
            0x12, 0x00,                                     //  4 version V2
            0xc0,                                           //  6 type CONNREQ
            0x00,                                           //  7 credits 0
            0x38, 0x00, 0x00, 0x00,                         //  8 nob 56
            0x00, 0x00, 0x00, 0x00,                         // 12 cksum: none
            0x02, 0x01, 0xa8, 0xc0, 0x00, 0x00, 0x05, 0x00, // 16 srcnid 192.168.1.2@o2ib
            0xa6, 0xb5, 0xc4, 0xd3, 0xe2, 0xf1, 0x05, 0x00, // 24 srcstamp
            0x03, 0x01, 0xa8, 0xc0, 0x01, 0x00, 0x05, 0x00, // 32 dstnid 192.168.1.3@o2ib1
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // 40 dststamp 0
            0x08, 0x00,                                     // 48 queue_depth 8
            0x01, 0x01,                                     // 50 max_frags 257
            0x00, 0x10, 0x00, 0x00,                         // 52 max_msg_size 4096
        ];
        assert_eq!(buf, want);
        assert_eq!(unpack(&want).unwrap(), Msg::new(h, MsgBody::ConnReq(cp)));
    }

    #[test]
    fn put_ack_two_frags_byte_image() {
        let fr = [RdmaFrag::new(0x0000_7f00_dead_0000, 4096), RdmaFrag::new(0x0000_7f00_beef_1000, 0x234)];
        let mut buf = [0u8; 4096];
        let nob = init_putack(&mut buf, 0x0102, 0xa1a2_a3a4_a5a6_a7a8, 0x1234_5678, &fr).unwrap();
        assert_eq!(nob, 96); // 72 + 2 * 12
        let h = MsgHeader { msg_type: MsgType::PutAck, nob, srcstamp: 1, dststamp: 2, ..hdr(1) };
        pack_header(&mut buf, &h, false).unwrap();
        #[rustfmt::skip]
        let want: [u8; 96] = [
            0x91, 0x1b, 0xe9, 0x0b,                         //  0 magic
            0x12, 0x00,                                     //  4 version V2
            0xd4,                                           //  6 type PUT_ACK
            0x01,                                           //  7 credits 1
            0x60, 0x00, 0x00, 0x00,                         //  8 nob 96
            0x00, 0x00, 0x00, 0x00,                         // 12 cksum: none
            0x01, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00, // 16 srcnid 10.0.0.1@o2ib
            0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // 24 srcstamp 1
            0x02, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00, // 32 dstnid 10.0.0.2@o2ib
            0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // 40 dststamp 2
            0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // 48 src_cookie 0x102
            0xa8, 0xa7, 0xa6, 0xa5, 0xa4, 0xa3, 0xa2, 0xa1, // 56 dst_cookie
            0x78, 0x56, 0x34, 0x12,                         // 64 rd_key 0x12345678
            0x02, 0x00, 0x00, 0x00,                         // 68 rd_nfrags 2
            0x00, 0x10, 0x00, 0x00,                         // 72 frag 0 nob 4096
            0x00, 0x00, 0xad, 0xde, 0x00, 0x7f, 0x00, 0x00, // 76 frag 0 addr (misaligned)
            0x34, 0x02, 0x00, 0x00,                         // 84 frag 1 nob 0x234
            0x00, 0x10, 0xef, 0xbe, 0x00, 0x7f, 0x00, 0x00, // 88 frag 1 addr
        ];
        assert_eq!(buf[..96], want);
        let m = unpack(&want).unwrap();
        let MsgBody::PutAck(ack) = m.body else { panic!("not a PUT_ACK: {m:?}") };
        assert_eq!((ack.src_cookie, ack.dst_cookie), (0x0102, 0xa1a2_a3a4_a5a6_a7a8));
        assert_eq!(ack.rd.key(), 0x1234_5678);
        assert_eq!(ack.rd.iter().collect::<Vec<_>>(), fr);
        assert_eq!(ack.rd.size(), Some(4096 + 0x234));
        assert_eq!(m.hdr, h);
    }

    #[test]
    fn get_done_byte_image_both_orders() {
        let mut buf = [0u8; 60];
        assert_eq!(init_completion(&mut buf, 0x0123_4567_89ab_cdef, -61), Ok(60));
        let h = MsgHeader { msg_type: MsgType::GetDone, nob: 60, ..hdr(2) };
        pack_header(&mut buf, &h, false).unwrap();
        #[rustfmt::skip]
        let want_le: [u8; 60] = [
            0x91, 0x1b, 0xe9, 0x0b,                         //  0 magic
            0x12, 0x00,                                     //  4 version V2
            0xd7,                                           //  6 type GET_DONE
            0x02,                                           //  7 credits 2
            0x3c, 0x00, 0x00, 0x00,                         //  8 nob 60
            0x00, 0x00, 0x00, 0x00,                         // 12 cksum: none
            0x01, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00, // 16 srcnid
            0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // 24 srcstamp
            0x02, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00, // 32 dstnid
            0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, // 40 dststamp
            0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // 48 cookie
            0xc3, 0xff, 0xff, 0xff,                         // 56 status -61 (-ENODATA)
        ];
        assert_eq!(buf, want_le);
        // The same message from a big-endian peer: every field flipped except the cookie,
        // which is an opaque token (here: the bytes it received in a GET_REQ).
        #[rustfmt::skip]
        let want_be: [u8; 60] = [
            0x0b, 0xe9, 0x1b, 0x91,                         //  0 magic, swapped
            0x00, 0x12,                                     //  4 version
            0xd7,                                           //  6 type
            0x02,                                           //  7 credits
            0x00, 0x00, 0x00, 0x3c,                         //  8 nob 60
            0x00, 0x00, 0x00, 0x00,                         // 12 cksum
            0x00, 0x05, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x01, // 16 srcnid
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // 24 srcstamp
            0x00, 0x05, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x02, // 32 dstnid
            0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // 40 dststamp
            0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01, // 48 cookie: never swapped
            0xff, 0xff, 0xff, 0xc3,                         // 56 status -61
        ];
        let le = unpack(&want_le).unwrap();
        let be = unpack(&want_be).unwrap();
        assert_eq!((le.order, be.order), (ByteOrder::Little, ByteOrder::Big));
        assert_eq!(be.hdr, le.hdr);
        assert_eq!(be.body, le.body);
        let body = MsgBody::GetDone(CompletionMsg { cookie: 0x0123_4567_89ab_cdef, status: -61 });
        assert_eq!(le.body, body);
        let mut again = [0u8; 60];
        Msg { order: ByteOrder::Big, ..le }.encode(&mut again, false).unwrap();
        assert_eq!(again, want_be);
    }

    #[test]
    fn cookies_echo_bit_identical_to_a_big_endian_peer() {
        // A big-endian kernel peer sends PUT_REQ with its cookie in its own order.
        let lh = lnet_hdr();
        let req = Msg {
            order: ByteOrder::Big,
            ..Msg::new(hdr(0), MsgBody::PutReq(PutReqMsg { lnet_hdr: &lh, cookie: 0 }))
        };
        let mut buf = [0u8; 4096];
        let nob = req.encode(&mut buf, false).unwrap() as usize;
        let peer_cookie_bytes = [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08];
        buf[120..128].copy_from_slice(&peer_cookie_bytes);
        let m = unpack(&buf[..nob]).unwrap();
        let MsgBody::PutReq(r) = m.body else { panic!("{m:?}") };
        // We reflect it in a PUT_ACK; the peer finds exactly its bytes.
        let mut ack = [0u8; 4096];
        init_putack(&mut ack, r.cookie, 5, 1, &frags(1)).unwrap();
        assert_eq!(ack[48..56], peer_cookie_bytes);
    }

    // ---- round trips ----

    #[test]
    fn every_type_round_trips_both_orders_with_and_without_cksum() {
        let lh = lnet_hdr();
        let payload: Vec<u8> = (0..IBLND_MAX_IMMEDIATE).map(|i| (i * 31) as u8).collect();
        for n in [1, 2, IBLND_MAX_RDMA_FRAGS] {
            let fr = frags(n);
            for plen in [0, 1, 1000, IBLND_MAX_IMMEDIATE] {
                for m in samples(&lh, &payload[..plen], &fr) {
                    for order in [ByteOrder::Little, ByteOrder::Big] {
                        for with_cksum in [false, true] {
                            let m = Msg { order, ..m };
                            let mut buf = vec![0u8; IBLND_MSG_SIZE];
                            let nob = m.encode(&mut buf, with_cksum).unwrap();
                            assert_eq!(nob as usize, m.body.nob(), "{m:?}");
                            assert_eq!(nob, m.hdr.nob);
                            let got = unpack(&buf[..nob as usize]).unwrap();
                            let sum = got.hdr.cksum;
                            if with_cksum {
                                let mut z = buf[..nob as usize].to_vec();
                                z[12..16].fill(0);
                                assert_eq!(sum, cksum(&z));
                            } else {
                                assert_eq!(sum, 0);
                            }
                            let want = Msg { hdr: MsgHeader { cksum: sum, ..m.hdr }, ..m };
                            assert_eq!(got, want);
                            // The whole rx buffer, longer than the message, decodes the same.
                            assert_eq!(unpack(&buf).unwrap(), want);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn swapped_messages_decode_to_the_same_values() {
        let lh = lnet_hdr();
        let payload = [0x42u8; 77];
        let fr = frags(IBLND_MAX_RDMA_FRAGS);
        for m in samples(&lh, &payload, &fr) {
            let mut le = vec![0u8; 4096];
            let mut be = vec![0u8; 4096];
            let nob = Msg { order: ByteOrder::Little, ..m }.encode(&mut le, false).unwrap();
            Msg { order: ByteOrder::Big, ..m }.encode(&mut be, false).unwrap();
            assert_eq!(be[..4], [0x0b, 0xe9, 0x1b, 0x91]);
            assert_ne!(le[..nob as usize], be[..nob as usize]);
            let (a, b) = (unpack(&le).unwrap(), unpack(&be).unwrap());
            assert_eq!((a.hdr, a.body), (b.hdr, b.body), "{}", m.hdr.msg_type);
            // The LNet header is never swapped.
            if let (MsgBody::GetReq(x), MsgBody::GetReq(y)) = (a.body, b.body) {
                assert_eq!(x.lnet_hdr, &lh);
                assert_eq!(y.lnet_hdr, &lh);
                assert_eq!(x.rd.frag(256), Some(fr[256]));
                assert_eq!(y.rd.frag(256), Some(fr[256]));
            }
        }
    }

    #[test]
    fn v1_messages_decode() {
        let mut buf = [0u8; 64];
        init_completion(&mut buf, 1, 2).unwrap();
        let h = MsgHeader { version: IBLND_MSG_VERSION_1, msg_type: MsgType::PutDone, nob: 60, ..hdr(0) };
        pack_header(&mut buf, &h, true).unwrap();
        assert_eq!(unpack(&buf).unwrap().hdr.version, 0x11);
    }

    #[test]
    fn immediate_payload_gathered_in_place() {
        let lh = lnet_hdr();
        let mut buf = [0u8; IBLND_MSG_SIZE];
        let area = init_immediate(&mut buf, &lh).unwrap();
        assert_eq!(area.len(), IBLND_MAX_IMMEDIATE);
        // Gather three fragments.
        let parts: [&[u8]; 3] = [b"hello, ", b"o2ib", b" world"];
        let mut off = 0;
        for p in parts {
            area[off..off + p.len()].copy_from_slice(p);
            off += p.len();
        }
        let nob = immediate_nob(off).unwrap();
        assert_eq!(nob, 120 + 17);
        let h = MsgHeader { msg_type: MsgType::Immediate, nob, ..hdr(4) };
        let sum = pack_header(&mut buf, &h, true).unwrap();
        assert_ne!(sum, 0);
        let m = unpack(&buf).unwrap();
        assert_eq!(m.body, MsgBody::Immediate(ImmediateMsg { lnet_hdr: &lh, payload: b"hello, o2ib world" }));
        assert_eq!(m.hdr.cksum, sum);
        // A bigger buffer still limits the payload area to 3976 bytes.
        let mut big = vec![0u8; 8192];
        assert_eq!(init_immediate(&mut big, &lh).unwrap().len(), IBLND_MAX_IMMEDIATE);
        let mut small = [0u8; 200];
        assert_eq!(init_immediate(&mut small, &lh).unwrap().len(), 80);
    }

    #[test]
    fn sizes() {
        assert_eq!(putack_nob(1), 84);
        assert_eq!(putack_nob(257), 72 + 12 * 257);
        assert_eq!(get_nob(2), 160);
        assert_eq!(get_nob(257), 136 + 12 * 257);
        assert!(get_nob(IBLND_MAX_RDMA_FRAGS) <= IBLND_MSG_SIZE);
        let min: Vec<usize> = MsgType::ALL.iter().map(|t| t.min_size()).collect();
        assert_eq!(min, [56, 56, 48, 120, 128, 60, 72, 60, 136, 60]);
        assert_eq!(IBLND_MAX_IMMEDIATE, 3976);
        assert_eq!(RDMA_FRAG_SIZE, 12);
    }

    #[test]
    fn msg_type_values_and_names() {
        for v in 0..=255u8 {
            if let Some(t) = MsgType::from_u8(v) {
                assert_eq!(t.as_u8(), v);
                assert!(MsgType::ALL.contains(&t));
            }
        }
        assert_eq!(MsgType::ALL.iter().filter(|t| t.has_rdma_desc()).count(), 2);
        assert_eq!(MsgType::ALL.iter().filter(|t| t.is_completion()).count(), 3);
        assert_eq!(MsgType::PutAck.to_string(), "PUT_ACK");
        assert_eq!(MsgType::from_u8(0xc2), None);
        assert_eq!(MsgType::from_u8(0xd8), None);
    }

    // ---- each validation rule, its own error ----

    /// A valid little-endian message of `body`, as bytes.
    fn bytes_of(body: MsgBody<'_>, with_cksum: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        let nob = Msg::new(hdr(0), body).encode(&mut buf, with_cksum).unwrap();
        buf.truncate(nob as usize);
        buf
    }

    fn set_u32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn too_short() {
        let b = bytes_of(MsgBody::Noop, false);
        for len in 0..48 {
            assert_eq!(unpack(&b[..len]), Err(WireError::TooShort { len }), "len {len}");
        }
    }

    #[test]
    fn bad_magic_and_socklnd_magic() {
        let mut b = bytes_of(MsgBody::Noop, false);
        set_u32(&mut b, 0, 0xdead_beef);
        assert_eq!(unpack(&b), Err(WireError::BadMagic { magic: 0xdead_beef }));
        set_u32(&mut b, 0, LNET_PROTO_MAGIC);
        assert_eq!(unpack(&b), Err(WireError::SocklndMagic));
        set_u32(&mut b, 0, LNET_PROTO_MAGIC.swap_bytes());
        assert_eq!(unpack(&b), Err(WireError::SocklndMagic));
        // Recognised from 6 bytes on, as the passive side needs.
        assert_eq!(unpack(&b[..6]), Err(WireError::SocklndMagic));
    }

    #[test]
    fn bad_version() {
        let mut b = bytes_of(MsgBody::Noop, false);
        for v in [0x10u16, 0x13, 0x1200, 0] {
            b[4..6].copy_from_slice(&v.to_le_bytes());
            assert_eq!(unpack(&b), Err(WireError::BadVersion { version: v }));
        }
    }

    #[test]
    fn bad_nob() {
        let mut b = bytes_of(MsgBody::Noop, false);
        set_u32(&mut b, 8, 47);
        assert_eq!(unpack(&b), Err(WireError::NobTooSmall { nob: 47 }));
        set_u32(&mut b, 8, 49);
        assert_eq!(unpack(&b), Err(WireError::NobExceedsReceived { nob: 49, received: 48 }));
        // An IMMEDIATE longer than 4096 bytes, with all of it received.
        let lh = lnet_hdr();
        let mut b = bytes_of(MsgBody::Immediate(ImmediateMsg { lnet_hdr: &lh, payload: &[] }), false);
        b.resize(5000, 0);
        set_u32(&mut b, 8, 4097);
        assert_eq!(unpack(&b), Err(WireError::TooLong { nob: 4097 }));
        set_u32(&mut b, 8, 4096);
        assert!(unpack(&b).is_ok());
    }

    #[test]
    fn checksum_mismatch_detected() {
        let mut b = bytes_of(MsgBody::GetDone(CompletionMsg { cookie: 5, status: 6 }), true);
        let wire = u32::from_le_bytes(b[12..16].try_into().unwrap());
        assert_ne!(wire, 0);
        assert!(unpack(&b).is_ok());
        b[59] ^= 0x40;
        let mut z = b.clone();
        z[12..16].fill(0);
        assert_eq!(unpack(&b), Err(WireError::BadChecksum { wire, computed: cksum(&z) }));
        // Clearing the field means "no checksum": accepted.
        b[12..16].fill(0);
        assert!(unpack(&b).is_ok());
    }

    #[test]
    fn src_nid_any() {
        let mut b = bytes_of(MsgBody::Noop, false);
        b[16..24].fill(0xff);
        assert_eq!(unpack(&b), Err(WireError::SrcNidAny));
    }

    #[test]
    fn unknown_type() {
        let mut b = bytes_of(MsgBody::Noop, false);
        for t in [0u8, 0xc2, 0xcf, 0xd8, 0xff] {
            b[6] = t;
            assert_eq!(unpack(&b), Err(WireError::UnknownType { msg_type: t }));
        }
    }

    #[test]
    fn body_too_short() {
        let mut b = bytes_of(MsgBody::Noop, false);
        b.resize(200, 0);
        for t in MsgType::ALL {
            let need = t.min_size();
            if need == MSG_HDR_SIZE {
                continue;
            }
            b[6] = t.as_u8();
            set_u32(&mut b, 8, need as u32 - 1);
            assert_eq!(unpack(&b), Err(WireError::BodyTooShort { msg_type: t, nob: need as u32 - 1, need }));
        }
    }

    #[test]
    fn bad_nfrags_and_frags_past_nob() {
        let lh = lnet_hdr();
        let fr = frags(2);
        let rd = RdmaDesc::new(9, &fr);
        let cases = [
            (
                bytes_of(MsgBody::PutAck(PutAckMsg { src_cookie: 1, dst_cookie: 2, rd }), false),
                MsgType::PutAck,
                PUTACK_RD,
            ),
            (
                bytes_of(MsgBody::GetReq(GetMsg { lnet_hdr: &lh, cookie: 3, rd }), false),
                MsgType::GetReq,
                GET_RD,
            ),
        ];
        for (good, t, rd_off) in cases {
            let nob = good.len() as u32;
            for nfrags in [0u32, 258, u32::MAX] {
                let mut b = good.clone();
                set_u32(&mut b, rd_off + 4, nfrags);
                assert_eq!(unpack(&b), Err(WireError::BadNfrags { msg_type: t, nfrags }));
            }
            for nfrags in [3u32, 257] {
                let mut b = good.clone();
                set_u32(&mut b, rd_off + 4, nfrags);
                // Even with the bytes received, past nob is out.
                b.resize(4096, 0);
                assert_eq!(
                    unpack(&b),
                    Err(WireError::FragsPastNob {
                        msg_type: t,
                        nfrags,
                        nob,
                        need: rd_off + 8 + 12 * nfrags as usize
                    })
                );
            }
            // One byte short of the second fragment.
            let mut b = good.clone();
            set_u32(&mut b, 8, nob - 1);
            assert!(matches!(unpack(&b), Err(WireError::FragsPastNob { nfrags: 2, .. })));
        }
    }

    // ---- connection checks ----

    #[test]
    fn stale_checks() {
        let h = hdr(0);
        let id = ConnIdentity {
            peer_nid: SRC,
            peer_incarnation: h.srcstamp,
            my_nid: DST,
            my_incarnation: h.dststamp,
        };
        assert_eq!(check_conn(&h, &id), Ok(()));
        let other = Nid::from_u64(0x0005_0000_0a00_0009);
        let cases = [
            (ConnIdentity { peer_nid: other, ..id }, WireError::StaleSrcNid { got: SRC, expected: other }),
            (ConnIdentity { my_nid: other, ..id }, WireError::StaleDstNid { got: DST, expected: other }),
            (
                ConnIdentity { peer_incarnation: 5, ..id },
                WireError::StaleSrcStamp { got: h.srcstamp, expected: 5 },
            ),
            (
                ConnIdentity { my_incarnation: 6, ..id },
                WireError::StaleDstStamp { got: h.dststamp, expected: 6 },
            ),
        ];
        for (id, err) in cases {
            assert_eq!(check_conn(&h, &id), Err(err));
            assert!(err.is_stale());
            assert!(!err.is_encode());
            assert!(err.to_string().contains("stale"), "{err}");
        }
        assert!(!WireError::SrcNidAny.is_stale());
    }

    // ---- encoding errors ----

    #[test]
    fn encode_errors() {
        let lh = lnet_hdr();
        let mut buf = [0u8; 4096];
        assert_eq!(immediate_nob(3976), Ok(4096));
        assert_eq!(immediate_nob(3977), Err(WireError::PayloadTooLarge { len: 3977 }));
        let big = vec![0u8; 3977];
        let m = Msg::new(hdr(0), MsgBody::Immediate(ImmediateMsg { lnet_hdr: &lh, payload: &big }));
        assert_eq!(m.encode(&mut buf, false), Err(WireError::PayloadTooLarge { len: 3977 }));
        assert_eq!(init_putack(&mut buf, 0, 0, 0, &[]), Err(WireError::FragCount { count: 0 }));
        assert_eq!(init_get(&mut buf, &lh, 0, 0, &frags(258)), Err(WireError::FragCount { count: 258 }));
        assert_eq!(
            init_completion(&mut buf[..59], 0, 0),
            Err(WireError::BufferTooSmall { need: 60, have: 59 })
        );
        assert_eq!(
            init_get(&mut buf[..159], &lh, 0, 0, &frags(2)),
            Err(WireError::BufferTooSmall { need: 160, have: 159 })
        );
        assert_eq!(
            init_immediate(&mut buf[..119], &lh),
            Err(WireError::BufferTooSmall { need: 120, have: 119 })
        );
        assert_eq!(init_noop(&mut buf[..47]), Err(WireError::BufferTooSmall { need: 48, have: 47 }));
        let h = MsgHeader { nob: 47, ..hdr(0) };
        assert_eq!(pack_header(&mut buf, &h, false), Err(WireError::NobTooSmall { nob: 47 }));
        let h = MsgHeader { nob: 4097, ..h };
        assert_eq!(pack_header(&mut buf, &h, false), Err(WireError::TooLong { nob: 4097 }));
        let h = MsgHeader { nob: 60, ..h };
        assert_eq!(
            pack_header(&mut buf[..59], &h, false),
            Err(WireError::BufferTooSmall { need: 60, have: 59 })
        );
        assert!(WireError::FragCount { count: 0 }.is_encode());
    }

    #[test]
    fn pack_header_touches_only_the_header() {
        let mut buf = [0xeeu8; 128];
        init_completion(&mut buf, 1, 2).unwrap();
        let body = buf[48..].to_vec();
        let h = MsgHeader { msg_type: MsgType::PutNak, nob: 60, ..hdr(7) };
        pack_header(&mut buf, &h, true).unwrap();
        assert_eq!(buf[48..], body[..]);
        // Packing again (a re-post with new credits) rewrites the checksum consistently.
        let h = MsgHeader { credits: 8, ..h };
        pack_header(&mut buf, &h, true).unwrap();
        assert_eq!(unpack(&buf).unwrap().hdr.credits, 8);
    }
}
