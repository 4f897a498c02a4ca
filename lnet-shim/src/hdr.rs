//! The LNet message header in its 72-byte nid4 wire form (`struct lnet_hdr_nid4`).
//!
//! Every LNet message an LND carries starts with this header. Unlike the LND's own message
//! header, it is **always little-endian** and packed, whatever the sender's byte order:
//!
//! | offset | field | type |
//! |---|---|---|
//! | 0 | `dest_nid` | u64 |
//! | 8 | `src_nid` | u64 |
//! | 16 | `dest_pid` | u32 |
//! | 20 | `src_pid` | u32 |
//! | 24 | `type` ([`LnetMsgType`]) | u32 |
//! | 28 | `payload_length` | u32 |
//! | 32 | per-type body ([`LnetMsg`]), 40 bytes | |
//!
//! The per-type bodies (a C union, so each is padded to the 40 bytes of the largest, PUT):
//!
//! | type | body (offsets from 32) |
//! |---|---|
//! | ACK | `dst_wmd` [`WireHandle`] @0, `match_bits` u64 @16, `mlength` u32 @24 |
//! | PUT | `ack_wmd` @0, `match_bits` u64 @16, `hdr_data` u64 @24, `ptl_index` u32 @32, `offset` u32 @36 |
//! | GET | `return_wmd` @0, `match_bits` u64 @16, `ptl_index` u32 @24, `src_offset` u32 @28, `sink_length` u32 @32 |
//! | REPLY | `dst_wmd` @0 |
//! | HELLO | `incarnation` u64 @0, `type` u32 @8 |
//!
//! Bytes of the union a type does not use are written as zero and ignored when reading.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::fmt;

use crate::nid::{Nid, ProcessId};

/// Size in bytes of the nid4 LNet header on the wire (`sizeof(struct lnet_hdr_nid4)`).
pub const LNET_HDR_SIZE: usize = 72;

/// Offset of the per-type body within the header.
const BODY_OFFSET: usize = 32;

/// A handle to an object (a memory descriptor) of a remote node, as carried in ACK, PUT, GET and
/// REPLY headers (`struct lnet_handle_wire`).
///
/// The interface cookie names one network interface in one epoch; the object cookie names one
/// object on that interface during its lifetime. A PUT that wants no ACK carries
/// [`WireHandle::NONE`] as its `ack_wmd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WireHandle {
    /// `wh_interface_cookie`.
    pub interface_cookie: u64,
    /// `wh_object_cookie`.
    pub object_cookie: u64,
}

impl WireHandle {
    /// The handle that names nothing: both cookies `LNET_WIRE_HANDLE_COOKIE_NONE` (all ones).
    pub const NONE: WireHandle = WireHandle { interface_cookie: u64::MAX, object_cookie: u64::MAX };

    /// A handle from its two cookies.
    pub const fn new(interface_cookie: u64, object_cookie: u64) -> WireHandle {
        WireHandle { interface_cookie, object_cookie }
    }

    /// Whether this is [`WireHandle::NONE`] (LNet's `lnet_is_wire_handle_none`: both cookies
    /// all ones).
    pub const fn is_none(&self) -> bool {
        self.interface_cookie == u64::MAX && self.object_cookie == u64::MAX
    }
}

/// The LNet message type in the header's `type` field (`enum lnet_msg_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LnetMsgType {
    /// `LNET_MSG_ACK` (0): acknowledges a PUT.
    Ack,
    /// `LNET_MSG_PUT` (1): writes the payload into a matched memory descriptor.
    Put,
    /// `LNET_MSG_GET` (2): asks for data from a matched memory descriptor.
    Get,
    /// `LNET_MSG_REPLY` (3): carries the data a GET asked for.
    Reply,
    /// `LNET_MSG_HELLO` (4): byte-stream LND handshake; not used by o2iblnd.
    Hello,
}

impl LnetMsgType {
    /// The value carried on the wire.
    pub const fn as_u32(self) -> u32 {
        match self {
            LnetMsgType::Ack => 0,
            LnetMsgType::Put => 1,
            LnetMsgType::Get => 2,
            LnetMsgType::Reply => 3,
            LnetMsgType::Hello => 4,
        }
    }

    /// The type for a wire value, if it is one LNet defines.
    pub const fn from_u32(raw: u32) -> Option<LnetMsgType> {
        match raw {
            0 => Some(LnetMsgType::Ack),
            1 => Some(LnetMsgType::Put),
            2 => Some(LnetMsgType::Get),
            3 => Some(LnetMsgType::Reply),
            4 => Some(LnetMsgType::Hello),
            _ => None,
        }
    }

    /// LNet's name for the type (`ACK`, `PUT`, `GET`, `REPLY`, `HELLO`).
    pub const fn name(self) -> &'static str {
        match self {
            LnetMsgType::Ack => "ACK",
            LnetMsgType::Put => "PUT",
            LnetMsgType::Get => "GET",
            LnetMsgType::Reply => "REPLY",
            LnetMsgType::Hello => "HELLO",
        }
    }
}

impl fmt::Display for LnetMsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Body of an ACK (`struct lnet_ack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AckMsg {
    /// The PUT initiator's memory descriptor the ACK is for (the PUT's `ack_wmd`).
    pub dst_wmd: WireHandle,
    /// The match bits of the acknowledged PUT.
    pub match_bits: u64,
    /// How many bytes the target accepted (the PUT's manipulated length).
    pub mlength: u32,
}

/// Body of a PUT (`struct lnet_put`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PutMsg {
    /// Where to send the ACK, or [`WireHandle::NONE`] for no ACK.
    pub ack_wmd: WireHandle,
    /// Match bits the target's match entries are compared with.
    pub match_bits: u64,
    /// 64 bits of out-of-band data delivered in the target's PUT event.
    pub hdr_data: u64,
    /// The target portal index.
    pub ptl_index: u32,
    /// Offset into the target memory descriptor (used when it manages offsets remotely).
    pub offset: u32,
}

/// Body of a GET (`struct lnet_get`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GetMsg {
    /// The initiator's memory descriptor the REPLY goes to.
    pub return_wmd: WireHandle,
    /// Match bits the target's match entries are compared with.
    pub match_bits: u64,
    /// The target portal index.
    pub ptl_index: u32,
    /// Offset into the target memory descriptor (used when it manages offsets remotely).
    pub src_offset: u32,
    /// How many bytes the initiator wants.
    pub sink_length: u32,
}

/// Body of a REPLY (`struct lnet_reply`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplyMsg {
    /// The GET initiator's memory descriptor (the GET's `return_wmd`).
    pub dst_wmd: WireHandle,
}

/// Body of a HELLO (`struct lnet_hello`), used by byte-stream LNDs only.
///
/// In a HELLO LNet puts a magic and protocol version where the destination NID normally is;
/// this codec does not interpret that, it reads those bytes as a NID like any other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HelloMsg {
    /// The sender's incarnation.
    pub incarnation: u64,
    /// LND-specific connection type.
    pub hello_type: u32,
}

/// The per-type part of an LNet header (`union lnet_cmd_hdr` with its type tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LnetMsg {
    /// An ACK.
    Ack(AckMsg),
    /// A PUT.
    Put(PutMsg),
    /// A GET.
    Get(GetMsg),
    /// A REPLY.
    Reply(ReplyMsg),
    /// A HELLO.
    Hello(HelloMsg),
}

impl LnetMsg {
    /// The message type the body belongs to.
    pub const fn msg_type(&self) -> LnetMsgType {
        match self {
            LnetMsg::Ack(_) => LnetMsgType::Ack,
            LnetMsg::Put(_) => LnetMsgType::Put,
            LnetMsg::Get(_) => LnetMsgType::Get,
            LnetMsg::Reply(_) => LnetMsgType::Reply,
            LnetMsg::Hello(_) => LnetMsgType::Hello,
        }
    }
}

/// An LNet message header (`struct lnet_hdr`, nid4 addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LnetHdr {
    /// The destination process (`dest_nid`, `dest_pid`).
    pub dest: ProcessId,
    /// The source process (`src_nid`, `src_pid`).
    pub src: ProcessId,
    /// Bytes of payload that follow the header.
    pub payload_length: u32,
    /// The type and its per-type fields.
    pub msg: LnetMsg,
}

/// Why bytes did not decode as an LNet header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HdrError {
    /// Fewer than [`LNET_HDR_SIZE`] bytes.
    #[error("LNet header too short: {len} bytes, need {LNET_HDR_SIZE}")]
    Short {
        /// How many bytes there were.
        len: usize,
    },
    /// The `type` field is not one of ACK, PUT, GET, REPLY, HELLO.
    #[error("LNet header has unknown message type {raw}")]
    UnknownType {
        /// The raw `type` value.
        raw: u32,
    },
}

impl LnetHdr {
    /// The header size on the wire, [`LNET_HDR_SIZE`].
    pub const SIZE: usize = LNET_HDR_SIZE;

    /// The message type.
    pub const fn msg_type(&self) -> LnetMsgType {
        self.msg.msg_type()
    }

    /// The 72-byte little-endian wire image. Union bytes the type does not use are zero.
    pub fn encode(&self) -> [u8; LNET_HDR_SIZE] {
        let mut w = Writer::new();
        w.u64(self.dest.nid.as_u64());
        w.u64(self.src.nid.as_u64());
        w.u32(self.dest.pid);
        w.u32(self.src.pid);
        w.u32(self.msg_type().as_u32());
        w.u32(self.payload_length);
        debug_assert_eq!(w.pos, BODY_OFFSET);
        match &self.msg {
            LnetMsg::Ack(m) => {
                w.handle(m.dst_wmd);
                w.u64(m.match_bits);
                w.u32(m.mlength);
            }
            LnetMsg::Put(m) => {
                w.handle(m.ack_wmd);
                w.u64(m.match_bits);
                w.u64(m.hdr_data);
                w.u32(m.ptl_index);
                w.u32(m.offset);
            }
            LnetMsg::Get(m) => {
                w.handle(m.return_wmd);
                w.u64(m.match_bits);
                w.u32(m.ptl_index);
                w.u32(m.src_offset);
                w.u32(m.sink_length);
            }
            LnetMsg::Reply(m) => w.handle(m.dst_wmd),
            LnetMsg::Hello(m) => {
                w.u64(m.incarnation);
                w.u32(m.hello_type);
            }
        }
        w.buf
    }

    /// Decodes the header at the start of `bytes`; bytes after the first [`LNET_HDR_SIZE`] (the
    /// payload, typically) are not looked at.
    ///
    /// Union bytes the type does not use are ignored, so `decode(x)?.encode()` equals `x` only
    /// where those bytes were zero.
    pub fn decode(bytes: &[u8]) -> Result<LnetHdr, HdrError> {
        let image: &[u8; LNET_HDR_SIZE] = bytes.first_chunk().ok_or(HdrError::Short { len: bytes.len() })?;
        let mut r = Reader::new(image);
        let dest_nid = r.u64();
        let src_nid = r.u64();
        let dest_pid = r.u32();
        let src_pid = r.u32();
        let raw_type = r.u32();
        let payload_length = r.u32();
        let msg_type = LnetMsgType::from_u32(raw_type).ok_or(HdrError::UnknownType { raw: raw_type })?;
        let msg = match msg_type {
            LnetMsgType::Ack => {
                LnetMsg::Ack(AckMsg { dst_wmd: r.handle(), match_bits: r.u64(), mlength: r.u32() })
            }
            LnetMsgType::Put => LnetMsg::Put(PutMsg {
                ack_wmd: r.handle(),
                match_bits: r.u64(),
                hdr_data: r.u64(),
                ptl_index: r.u32(),
                offset: r.u32(),
            }),
            LnetMsgType::Get => LnetMsg::Get(GetMsg {
                return_wmd: r.handle(),
                match_bits: r.u64(),
                ptl_index: r.u32(),
                src_offset: r.u32(),
                sink_length: r.u32(),
            }),
            LnetMsgType::Reply => LnetMsg::Reply(ReplyMsg { dst_wmd: r.handle() }),
            LnetMsgType::Hello => LnetMsg::Hello(HelloMsg { incarnation: r.u64(), hello_type: r.u32() }),
        };
        Ok(LnetHdr {
            dest: ProcessId::new(Nid::from_u64(dest_nid), dest_pid),
            src: ProcessId::new(Nid::from_u64(src_nid), src_pid),
            payload_length,
            msg,
        })
    }
}

/// Sequential little-endian writer over a zeroed header image. Writes past the end are dropped
/// (the layouts above never get there; the zip keeps this panic-free without indexing).
struct Writer {
    buf: [u8; LNET_HDR_SIZE],
    pos: usize,
}

impl Writer {
    fn new() -> Writer {
        Writer { buf: [0; LNET_HDR_SIZE], pos: 0 }
    }

    fn bytes<const N: usize>(&mut self, v: [u8; N]) {
        // A range, not a byte loop: with every call inlined `pos` is a constant, and this is
        // one store (a header is encoded for every message sent).
        if let Some(dst) = self.buf.get_mut(self.pos..self.pos + N) {
            dst.copy_from_slice(&v);
        }
        self.pos += N;
    }

    fn u32(&mut self, v: u32) {
        self.bytes(v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.bytes(v.to_le_bytes());
    }

    fn handle(&mut self, h: WireHandle) {
        self.u64(h.interface_cookie);
        self.u64(h.object_cookie);
    }
}

/// Sequential little-endian reader over a header image (the counterpart of [`Writer`]).
struct Reader<'a> {
    buf: &'a [u8; LNET_HDR_SIZE],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8; LNET_HDR_SIZE]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        // As `Writer::bytes`: one load once inlined.
        let out = self.buf.get(self.pos..self.pos + N).and_then(|s| <[u8; N]>::try_from(s).ok());
        self.pos += N;
        out.unwrap_or([0; N])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    fn handle(&mut self) -> WireHandle {
        WireHandle { interface_cookie: self.u64(), object_cookie: self.u64() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nid(s: &str) -> Nid {
        s.parse().unwrap()
    }

    /// 10.0.0.2@o2ib pid 12345 -> 10.0.0.1@o2ib pid 12345.
    fn endpoints() -> (ProcessId, ProcessId) {
        (
            ProcessId::new(nid("10.0.0.1@o2ib"), ProcessId::PID_LUSTRE),
            ProcessId::new(nid("10.0.0.2@o2ib"), ProcessId::PID_LUSTRE),
        )
    }

    #[test]
    fn put_image_is_byte_exact() {
        let (dest, src) = endpoints();
        let hdr = LnetHdr {
            dest,
            src,
            payload_length: 4096,
            msg: LnetMsg::Put(PutMsg {
                ack_wmd: WireHandle::new(0x1122_3344_5566_7788, 0x99aa_bbcc_ddee_ff00),
                match_bits: 0x0000_0001_0002_0003,
                hdr_data: 0xdead_beef_cafe_f00d,
                ptl_index: 4,
                offset: 0x10,
            }),
        };
        #[rustfmt::skip]
        let expected: [u8; 72] = [
            // 0: dest_nid 0x0005_0000_0a00_0001 (10.0.0.1@o2ib), little-endian
            0x01, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00,
            // 8: src_nid 0x0005_0000_0a00_0002 (10.0.0.2@o2ib)
            0x02, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00,
            // 16: dest_pid 12345 = 0x3039
            0x39, 0x30, 0x00, 0x00,
            // 20: src_pid 12345
            0x39, 0x30, 0x00, 0x00,
            // 24: type PUT = 1
            0x01, 0x00, 0x00, 0x00,
            // 28: payload_length 4096 = 0x1000
            0x00, 0x10, 0x00, 0x00,
            // 32: ack_wmd.wh_interface_cookie
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
            // 40: ack_wmd.wh_object_cookie
            0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99,
            // 48: match_bits
            0x03, 0x00, 0x02, 0x00, 0x01, 0x00, 0x00, 0x00,
            // 56: hdr_data
            0x0d, 0xf0, 0xfe, 0xca, 0xef, 0xbe, 0xad, 0xde,
            // 64: ptl_index 4
            0x04, 0x00, 0x00, 0x00,
            // 68: offset 16
            0x10, 0x00, 0x00, 0x00,
        ];
        assert_eq!(hdr.encode(), expected);
        assert_eq!(LnetHdr::decode(&expected).unwrap(), hdr);
    }

    #[test]
    fn get_image_is_byte_exact() {
        let (dest, src) = endpoints();
        let hdr = LnetHdr {
            dest,
            src,
            payload_length: 0,
            msg: LnetMsg::Get(GetMsg {
                return_wmd: WireHandle::new(0x0102_0304_0506_0708, 0x0000_0000_0000_002a),
                match_bits: 0xffff_0000_ffff_0000,
                ptl_index: 10,
                src_offset: 0x200,
                sink_length: 0x10_0000,
            }),
        };
        #[rustfmt::skip]
        let expected: [u8; 72] = [
            // 0: dest_nid 10.0.0.1@o2ib
            0x01, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00,
            // 8: src_nid 10.0.0.2@o2ib
            0x02, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x05, 0x00,
            // 16: dest_pid 12345, 20: src_pid 12345
            0x39, 0x30, 0x00, 0x00, 0x39, 0x30, 0x00, 0x00,
            // 24: type GET = 2
            0x02, 0x00, 0x00, 0x00,
            // 28: payload_length 0 (a GET carries no payload)
            0x00, 0x00, 0x00, 0x00,
            // 32: return_wmd.wh_interface_cookie
            0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,
            // 40: return_wmd.wh_object_cookie 42
            0x2a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            // 48: match_bits
            0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0xff, 0xff,
            // 56: ptl_index 10
            0x0a, 0x00, 0x00, 0x00,
            // 60: src_offset 0x200
            0x00, 0x02, 0x00, 0x00,
            // 64: sink_length 1 MiB = 0x100000
            0x00, 0x00, 0x10, 0x00,
            // 68..72: unused union bytes, zero
            0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(hdr.encode(), expected);
        assert_eq!(LnetHdr::decode(&expected).unwrap(), hdr);
    }

    fn samples() -> Vec<LnetHdr> {
        let (dest, src) = endpoints();
        let h = WireHandle::new(7, 9);
        let msgs = [
            LnetMsg::Ack(AckMsg { dst_wmd: h, match_bits: 0x55, mlength: 1 << 20 }),
            LnetMsg::Put(PutMsg {
                ack_wmd: WireHandle::NONE,
                match_bits: u64::MAX,
                hdr_data: 1,
                ptl_index: 63,
                offset: u32::MAX,
            }),
            LnetMsg::Get(GetMsg {
                return_wmd: h,
                match_bits: 0,
                ptl_index: 0,
                src_offset: 0,
                sink_length: 3976,
            }),
            LnetMsg::Reply(ReplyMsg { dst_wmd: h }),
            LnetMsg::Hello(HelloMsg { incarnation: 0x0123_4567_89ab_cdef, hello_type: 3 }),
        ];
        msgs.into_iter().map(|msg| LnetHdr { dest, src, payload_length: 17, msg }).collect()
    }

    #[test]
    fn all_types_round_trip() {
        for hdr in samples() {
            let image = hdr.encode();
            assert_eq!(LnetHdr::decode(&image).unwrap(), hdr, "{}", hdr.msg_type());
            // Trailing payload bytes are not part of the header.
            let mut with_payload = image.to_vec();
            with_payload.extend_from_slice(&[0xab; 40]);
            assert_eq!(LnetHdr::decode(&with_payload).unwrap(), hdr);
        }
    }

    #[test]
    fn unused_union_bytes_are_zero_and_ignored() {
        for hdr in samples() {
            let image = hdr.encode();
            let used = match hdr.msg {
                LnetMsg::Ack(_) => 60,
                LnetMsg::Put(_) => 72,
                LnetMsg::Get(_) => 68,
                LnetMsg::Reply(_) => 48,
                LnetMsg::Hello(_) => 44,
            };
            assert!(image[used..].iter().all(|&b| b == 0), "{}", hdr.msg_type());
            let mut dirty = image;
            dirty[used..].fill(0xee);
            assert_eq!(LnetHdr::decode(&dirty).unwrap(), hdr, "{}", hdr.msg_type());
        }
    }

    #[test]
    fn types_and_handles() {
        for raw in 0..5 {
            assert_eq!(LnetMsgType::from_u32(raw).unwrap().as_u32(), raw);
        }
        assert_eq!(LnetMsgType::from_u32(5), None);
        assert!(WireHandle::NONE.is_none());
        assert!(!WireHandle::new(u64::MAX, 0).is_none());
        assert_eq!(LnetMsgType::Reply.to_string(), "REPLY");
    }

    #[test]
    fn short_and_unknown_inputs_are_typed_errors() {
        let image = samples()[1].encode();
        for len in 0..LNET_HDR_SIZE {
            assert_eq!(LnetHdr::decode(&image[..len]), Err(HdrError::Short { len }));
        }
        let mut bad = image;
        bad[24..28].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(LnetHdr::decode(&bad), Err(HdrError::UnknownType { raw: 5 }));
        bad[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = LnetHdr::decode(&bad).unwrap_err();
        assert_eq!(err, HdrError::UnknownType { raw: u32::MAX });
        assert!(err.to_string().contains("4294967295"), "{err}");
    }

    /// xorshift64: deterministic, no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
    }

    #[test]
    fn fuzz_decode_never_panics() {
        const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rng = Rng(SEED);
        let valid: Vec<[u8; LNET_HDR_SIZE]> = samples().iter().map(LnetHdr::encode).collect();
        let mut decoded = 0u32;
        for i in 0..100_000u32 {
            let mut input: Vec<u8> = match rng.next() % 3 {
                // Pure noise of any length up to 100 bytes.
                0 => (0..rng.next() % 101).map(|_| rng.next() as u8).collect(),
                // A valid image with a few bytes flipped (often into an unknown type).
                1 => {
                    let mut v = valid[(rng.next() % 5) as usize].to_vec();
                    for _ in 0..=(rng.next() % 4) {
                        let at = (rng.next() % v.len() as u64) as usize;
                        v[at] ^= rng.next() as u8;
                    }
                    v
                }
                // A valid image truncated or extended.
                _ => {
                    let mut v = valid[(rng.next() % 5) as usize].to_vec();
                    v.resize((rng.next() % 100) as usize, 0x5a);
                    v
                }
            };
            // Keep the type valid in a third of the noise cases so bodies get decoded too.
            if input.len() >= 28 && rng.next() % 3 == 0 {
                input[24..28].copy_from_slice(&((rng.next() % 5) as u32).to_le_bytes());
            }
            match LnetHdr::decode(&input) {
                Ok(hdr) => {
                    decoded += 1;
                    assert!(input.len() >= LNET_HDR_SIZE, "seed {SEED:#x} iteration {i}");
                    let again = hdr.encode();
                    assert_eq!(again[..32], input[..32], "seed {SEED:#x} iteration {i}");
                    assert_eq!(
                        LnetHdr::decode(&again),
                        Ok(hdr),
                        "seed {SEED:#x} iteration {i}: re-encoding changed the header"
                    );
                }
                Err(HdrError::Short { len }) => {
                    assert!(len < LNET_HDR_SIZE, "seed {SEED:#x} iteration {i}");
                    assert_eq!(len, input.len(), "seed {SEED:#x} iteration {i}");
                }
                Err(HdrError::UnknownType { raw }) => {
                    assert!(raw > 4, "seed {SEED:#x} iteration {i}");
                }
            }
        }
        assert!(decoded > 10_000, "seed {SEED:#x}: only {decoded} inputs decoded");
    }
}
