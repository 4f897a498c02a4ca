//! Reject private data (`kib_rej`), carried with `IB_CM_REJ_CONSUMER_DEFINED`.
//!
//! On the wire, 24 bytes in the sender's order: `{u32 magic, u16 version, u8 why, u8 pad,
//! u64 incarnation, kib_connparams}`. A rejecting o2iblnd tells the peer its protocol
//! (magic, version), why, its incarnation and the parameters it would accept (its queue depth,
//! 257 fragments, 4096-byte messages). Decoding follows the active side (`kiblnd_rejected`):
//! 7 bytes identify magic, version and reason; the incarnation and parameters are read only
//! from a full 24 bytes of a V2 reject (the CM usually delivers more, e.g. 148 bytes on IB).
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::fmt;

use super::msg::{ConnParams, RawConnParams};
use super::{
    ByteOrder, IBLND_MSG_MAGIC, IBLND_MSG_VERSION_1, IBLND_MSG_VERSION_2, KIB_REJ_SIZE, LNET_PROTO_MAGIC,
    WireError,
};

/// Bytes that identify a reject: magic, version, why (`offsetof(kib_rej, ibr_padding)`).
const REJ_MIN: usize = 7;

/// `kib_rej` as laid out on the wire.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RawRej {
    magic: [u8; 4],
    version: [u8; 2],
    why: u8,
    padding: u8,
    incarnation: [u8; 8],
    cp: RawConnParams,
}

const _: () = assert!(size_of::<RawRej>() == KIB_REJ_SIZE);

/// Why a connection was rejected (`IBLND_REJECT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum RejectReason {
    /// `IBLND_REJECT_CONN_RACE` (1): both sides connected at once and you lost.
    ConnRace = 1,
    /// `IBLND_REJECT_NO_RESOURCES` (2): out of memory or connections.
    NoResources = 2,
    /// `IBLND_REJECT_FATAL` (3): anything else (also what a V1 peer answers to V2).
    Fatal = 3,
    /// `IBLND_REJECT_CONN_UNCOMPAT` (4): incompatible protocol version.
    ConnUncompat = 4,
    /// `IBLND_REJECT_CONN_STALE` (5): stale peer or incarnation.
    ConnStale = 5,
    /// `IBLND_REJECT_RDMA_FRAGS` (6): the fragment count does not match mine.
    RdmaFrags = 6,
    /// `IBLND_REJECT_MSG_QUEUE_SIZE` (7): the queue depth does not match mine.
    MsgQueueSize = 7,
    /// `IBLND_REJECT_INVALID_SRV_ID` (8): defined, never sent.
    InvalidSrvId = 8,
    /// `IBLND_REJECT_EARLY` (9): the NI is not up yet.
    Early = 9,
}

impl RejectReason {
    /// The reason of a wire value, if defined.
    pub const fn from_u8(v: u8) -> Option<RejectReason> {
        match v {
            1 => Some(RejectReason::ConnRace),
            2 => Some(RejectReason::NoResources),
            3 => Some(RejectReason::Fatal),
            4 => Some(RejectReason::ConnUncompat),
            5 => Some(RejectReason::ConnStale),
            6 => Some(RejectReason::RdmaFrags),
            7 => Some(RejectReason::MsgQueueSize),
            8 => Some(RejectReason::InvalidSrvId),
            9 => Some(RejectReason::Early),
            _ => None,
        }
    }

    /// The wire value (`ibr_why`).
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The constant's name without its prefix: `CONN_RACE`, `FATAL`, ...
    pub const fn name(self) -> &'static str {
        match self {
            RejectReason::ConnRace => "CONN_RACE",
            RejectReason::NoResources => "NO_RESOURCES",
            RejectReason::Fatal => "FATAL",
            RejectReason::ConnUncompat => "CONN_UNCOMPAT",
            RejectReason::ConnStale => "CONN_STALE",
            RejectReason::RdmaFrags => "RDMA_FRAGS",
            RejectReason::MsgQueueSize => "MSG_QUEUE_SIZE",
            RejectReason::InvalidSrvId => "INVALID_SRV_ID",
            RejectReason::Early => "EARLY",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Reject private data (`kib_rej`), in native order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KibRej {
    /// The byte order it was sent in; [`KibRej::encode`] uses it.
    pub order: ByteOrder,
    /// The rejecter's magic (`ibr_magic`): [`IBLND_MSG_MAGIC`], or [`LNET_PROTO_MAGIC`] from
    /// a peer speaking the generic LNet protocol.
    pub magic: u32,
    /// The rejecter's version (`ibr_version`): 0x11 or 0x12.
    pub version: u16,
    /// The raw reason (`ibr_why`); see [`KibRej::reason`]. Unknown values are kept: o2iblnd
    /// treats them as a plain failure.
    pub why: u8,
    /// The rejecter's incarnation (`ibr_incarnation`); `None` from a V1 peer or a reject too
    /// short to carry it (o2iblnd then assumes `-1`). Encoded as 0 when `None`.
    pub incarnation: Option<u64>,
    /// The parameters the rejecter would accept (`ibr_cp`); present exactly when
    /// `incarnation` is. Encoded as zeros when `None`.
    pub cp: Option<ConnParams>,
}

impl KibRej {
    /// A reject to send (native order, o2iblnd magic): I speak `version`, refuse for `why`,
    /// am incarnation `incarnation` and accept `cp`.
    pub const fn new(version: u16, why: RejectReason, incarnation: u64, cp: ConnParams) -> KibRej {
        KibRej {
            order: ByteOrder::NATIVE,
            magic: IBLND_MSG_MAGIC,
            version,
            why: why.as_u8(),
            incarnation: Some(incarnation),
            cp: Some(cp),
        }
    }

    /// The reason, if it is one o2iblnd defines.
    pub const fn reason(&self) -> Option<RejectReason> {
        RejectReason::from_u8(self.why)
    }

    /// Whether the rejecter speaks the generic LNet protocol (`LNET_PROTO_MAGIC`).
    pub const fn is_lnet_proto(&self) -> bool {
        self.magic == LNET_PROTO_MAGIC
    }

    /// The 24 wire bytes, in `self.order` (padding zero).
    pub fn encode(&self) -> [u8; KIB_REJ_SIZE] {
        let o = self.order;
        let raw = RawRej {
            magic: o.put_u32(self.magic),
            version: o.put_u16(self.version),
            why: self.why,
            padding: 0,
            incarnation: o.put_u64(self.incarnation.unwrap_or(0)),
            cp: self.cp.unwrap_or_default().to_raw(o),
        };
        bytemuck::cast(raw)
    }

    /// Decodes reject private data of any length (extra bytes are ignored), in either byte
    /// order. Fails if shorter than 7 bytes, if the magic is neither o2iblnd's nor
    /// `LNET_PROTO_MAGIC`, or if the version is neither V1 nor V2.
    pub fn decode(priv_data: &[u8]) -> Result<KibRej, WireError> {
        let len = priv_data.len();
        let short = WireError::RejTooShort { len };
        let head = priv_data.get(..REJ_MIN).ok_or(short)?;
        // Pad the first 7 bytes (or all 24) into a full struct.
        let mut full = [0u8; KIB_REJ_SIZE];
        let complete = match priv_data.get(..KIB_REJ_SIZE) {
            Some(all) => {
                full.copy_from_slice(all);
                true
            }
            None => {
                full.get_mut(..REJ_MIN).ok_or(short)?.copy_from_slice(head);
                false
            }
        };
        let raw: RawRej = bytemuck::cast(full);
        let order = ByteOrder::of_magic(raw.magic, IBLND_MSG_MAGIC)
            .or_else(|| ByteOrder::of_magic(raw.magic, LNET_PROTO_MAGIC))
            .ok_or(WireError::BadMagic { magic: u32::from_le_bytes(raw.magic) })?;
        let version = order.get_u16(raw.version);
        if version != IBLND_MSG_VERSION_2 && version != IBLND_MSG_VERSION_1 {
            return Err(WireError::BadVersion { version });
        }
        let v2 = complete && version > IBLND_MSG_VERSION_1;
        Ok(KibRej {
            order,
            magic: order.get_u32(raw.magic),
            version,
            why: raw.why,
            incarnation: v2.then(|| order.get_u64(raw.incarnation)),
            cp: v2.then(|| ConnParams::from_raw(&raw.cp, order)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CP: ConnParams = ConnParams { queue_depth: 8, max_frags: 257, max_msg_size: 4096 };

    #[test]
    fn reject_byte_image() {
        let rej = KibRej::new(0x12, RejectReason::MsgQueueSize, 0x0001_0203_0405_0607, CP);
        #[rustfmt::skip]
        let want = [
            0x91, 0x1b, 0xe9, 0x0b,                         // ibr_magic 0x0be91b91
            0x12, 0x00,                                     // ibr_version V2
            0x07,                                           // ibr_why MSG_QUEUE_SIZE
            0x00,                                           // ibr_padding
            0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x00, // ibr_incarnation
            0x08, 0x00,                                     // ibcp_queue_depth 8
            0x01, 0x01,                                     // ibcp_max_frags 257
            0x00, 0x10, 0x00, 0x00,                         // ibcp_max_msg_size 4096
        ];
        assert_eq!(rej.encode(), want);
        assert_eq!(KibRej::decode(&want), Ok(rej));
    }

    #[test]
    fn big_endian_reject_decodes_to_same_values() {
        let rej = KibRej::new(0x12, RejectReason::ConnStale, 0xfeed_f00d_1234_5678, CP);
        let be = KibRej { order: ByteOrder::Big, ..rej };
        let bytes = be.encode();
        assert_eq!(bytes[..4], [0x0b, 0xe9, 0x1b, 0x91]);
        assert_eq!(bytes[16..18], [0x00, 0x08]);
        let back = KibRej::decode(&bytes).unwrap();
        assert_eq!(back.order, ByteOrder::Big);
        assert_eq!(KibRej { order: ByteOrder::Little, ..back }, rej);
        assert_eq!(back.reason(), Some(RejectReason::ConnStale));
    }

    #[test]
    fn longer_private_data_is_fine_and_short_v2_loses_params() {
        let rej = KibRej::new(0x12, RejectReason::ConnRace, 42, CP);
        let mut cm = [0xeeu8; 148];
        cm[..24].copy_from_slice(&rej.encode());
        assert_eq!(KibRej::decode(&cm), Ok(rej));
        for len in 7..24 {
            let r = KibRej::decode(&cm[..len]).unwrap();
            assert_eq!(r.why, 1);
            assert_eq!((r.incarnation, r.cp), (None, None));
        }
        for len in 0..7 {
            assert_eq!(KibRej::decode(&cm[..len]), Err(WireError::RejTooShort { len }));
        }
    }

    #[test]
    fn v1_reject_carries_no_params() {
        let mut bytes = KibRej::new(0x11, RejectReason::Fatal, 42, CP).encode();
        let r = KibRej::decode(&bytes).unwrap();
        assert_eq!((r.version, r.reason()), (0x11, Some(RejectReason::Fatal)));
        assert_eq!((r.incarnation, r.cp), (None, None));
        bytes[4] = 0x13;
        assert_eq!(KibRej::decode(&bytes), Err(WireError::BadVersion { version: 0x13 }));
    }

    #[test]
    fn lnet_proto_magic_and_bad_magic() {
        let mut r = KibRej::new(0x12, RejectReason::Fatal, 1, CP);
        r.magic = LNET_PROTO_MAGIC;
        for order in [ByteOrder::Little, ByteOrder::Big] {
            let back = KibRej::decode(&KibRej { order, ..r }.encode()).unwrap();
            assert!(back.is_lnet_proto());
            assert_eq!(back.order, order);
        }
        let mut bytes = r.encode();
        bytes[0] ^= 1;
        assert_eq!(KibRej::decode(&bytes), Err(WireError::BadMagic { magic: LNET_PROTO_MAGIC ^ 1 }));
    }

    #[test]
    fn reasons_round_trip() {
        for v in 0..=255u8 {
            match RejectReason::from_u8(v) {
                Some(r) => {
                    assert!((1..=9).contains(&v));
                    assert_eq!(r.as_u8(), v);
                    assert!(!r.to_string().is_empty());
                }
                None => assert!(v == 0 || v > 9),
            }
        }
        assert_eq!(RejectReason::Early.as_u8(), 9);
        assert_eq!(RejectReason::InvalidSrvId.name(), "INVALID_SRV_ID");
        let mut bytes = KibRej::new(0x12, RejectReason::Fatal, 1, CP).encode();
        bytes[6] = 200;
        let r = KibRej::decode(&bytes).unwrap();
        assert_eq!((r.why, r.reason()), (200, None));
    }
}
