//! Wire errors: one variant per cause.
//!
//! Decoding errors are what `kiblnd_unpack_msg` answers with `-EPROTO`; the `Stale*` variants
//! come from [`check_conn`](super::check_conn) and are the LND's `-ESTALE` (close the
//! connection); the rest are encoding mistakes by the caller.

use lnet_shim::Nid;

use super::msg::MsgType;

/// Why a message, descriptor or reject did not decode, failed a connection check, or could not
/// be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the 48-byte message header (or than the 6 bytes of magic and version
    /// needed to identify the protocol at all).
    #[error("short message: {len} bytes received, the o2iblnd header needs 48")]
    TooShort {
        /// Bytes received.
        len: usize,
    },
    /// The magic is `LNET_PROTO_MAGIC` (either order): an old socklnd-style or future
    /// protocol, not o2iblnd. A passive side rejects such a CONNREQ, telling the peer its
    /// protocol.
    #[error("LNET_PROTO_MAGIC 0x45726963 instead of the o2iblnd magic: not an o2iblnd peer")]
    SocklndMagic,
    /// The magic is neither the o2iblnd magic nor `LNET_PROTO_MAGIC`, in either byte order.
    #[error("bad magic {magic:#010x}, expected 0x0be91b91 in either byte order")]
    BadMagic {
        /// The first word, read little-endian.
        magic: u32,
    },
    /// The version is neither V1 (0x11) nor V2 (0x12).
    #[error("unknown o2iblnd version {version:#x}, expected 0x11 or 0x12")]
    BadVersion {
        /// The version, in native order.
        version: u16,
    },
    /// `ibm_nob` is smaller than the header it includes.
    #[error("bad message length {nob}: smaller than the 48-byte header")]
    NobTooSmall {
        /// The `ibm_nob` field.
        nob: u32,
    },
    /// `ibm_nob` claims more bytes than were received.
    #[error("short message: got {received} bytes, header says {nob}")]
    NobExceedsReceived {
        /// The `ibm_nob` field.
        nob: u32,
        /// Bytes actually received.
        received: usize,
    },
    /// `ibm_nob` is larger than an o2iblnd message buffer (an IMMEDIATE over 4096 bytes).
    #[error("message of {nob} bytes exceeds the 4096-byte o2iblnd message size")]
    TooLong {
        /// The `ibm_nob` field.
        nob: u32,
    },
    /// The checksum on the wire does not match the bytes.
    #[error("bad checksum: message says {wire:#010x}, bytes give {computed:#010x}")]
    BadChecksum {
        /// The `ibm_cksum` field.
        wire: u32,
        /// The checksum of the received bytes.
        computed: u32,
    },
    /// The source NID is `LNET_NID_ANY`.
    #[error("bad source NID: LNET_NID_ANY")]
    SrcNidAny,
    /// The message type is not one o2iblnd defines.
    #[error("unknown message type {msg_type:#04x}")]
    UnknownType {
        /// The `ibm_type` field.
        msg_type: u8,
    },
    /// `ibm_nob` is smaller than the fixed body of the message type.
    #[error("short {msg_type}: {nob} bytes, needs at least {need}")]
    BodyTooShort {
        /// The message type.
        msg_type: MsgType,
        /// The `ibm_nob` field.
        nob: u32,
        /// The smallest valid message of this type.
        need: usize,
    },
    /// An RDMA descriptor's fragment count is 0 or above 257.
    #[error("bad nfrags {nfrags} in {msg_type}: should be 0 < n <= 257")]
    BadNfrags {
        /// The message type (PUT_ACK or GET_REQ).
        msg_type: MsgType,
        /// The `rd_nfrags` field.
        nfrags: u32,
    },
    /// An RDMA descriptor's fragments run past the end of the message.
    #[error("short {msg_type}: {nob} bytes, {nfrags} fragments need {need}")]
    FragsPastNob {
        /// The message type (PUT_ACK or GET_REQ).
        msg_type: MsgType,
        /// The `rd_nfrags` field.
        nfrags: u32,
        /// The `ibm_nob` field.
        nob: u32,
        /// Bytes the descriptor needs.
        need: usize,
    },
    /// Reject private data too short to hold magic, version and reason (7 bytes).
    #[error("short reject private data: {len} bytes, needs at least 7")]
    RejTooShort {
        /// Bytes received.
        len: usize,
    },
    /// The source NID is not the connection's peer (`-ESTALE`).
    #[error("stale rx: source NID {got}, connection's peer is {expected}")]
    StaleSrcNid {
        /// The `ibm_srcnid` field.
        got: Nid,
        /// The connection's peer.
        expected: Nid,
    },
    /// The destination NID is not this NI (`-ESTALE`).
    #[error("stale rx: destination NID {got}, this NI is {expected}")]
    StaleDstNid {
        /// The `ibm_dstnid` field.
        got: Nid,
        /// This NI's NID.
        expected: Nid,
    },
    /// The source stamp is not the incarnation the peer connected with (`-ESTALE`).
    #[error("stale rx: source incarnation {got}, connection's peer incarnation is {expected}")]
    StaleSrcStamp {
        /// The `ibm_srcstamp` field.
        got: u64,
        /// The peer's incarnation on this connection.
        expected: u64,
    },
    /// The destination stamp is not this NI's incarnation (`-ESTALE`).
    #[error("stale rx: destination incarnation {got}, this NI's incarnation is {expected}")]
    StaleDstStamp {
        /// The `ibm_dststamp` field.
        got: u64,
        /// This NI's incarnation.
        expected: u64,
    },
    /// Encoding: the buffer cannot hold the message.
    #[error("buffer of {have} bytes cannot hold a {need}-byte message")]
    BufferTooSmall {
        /// Bytes the message needs.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Encoding: an IMMEDIATE payload larger than 3976 bytes.
    #[error("IMMEDIATE payload of {len} bytes exceeds the 3976-byte maximum")]
    PayloadTooLarge {
        /// Payload bytes.
        len: usize,
    },
    /// Encoding: an RDMA descriptor with no fragments or more than 257.
    #[error("cannot encode an RDMA descriptor of {count} fragments: should be 0 < n <= 257")]
    FragCount {
        /// Fragments given.
        count: usize,
    },
}

impl WireError {
    /// Whether this is a per-connection identity failure (`-ESTALE` in the LND: the message
    /// belongs to an older connection or incarnation; close the connection).
    pub fn is_stale(&self) -> bool {
        matches!(
            self,
            WireError::StaleSrcNid { .. }
                | WireError::StaleDstNid { .. }
                | WireError::StaleSrcStamp { .. }
                | WireError::StaleDstStamp { .. }
        )
    }

    /// Whether this is an encoding error (a caller bug or an oversized request), as opposed to
    /// bad bytes from a peer.
    pub fn is_encode(&self) -> bool {
        matches!(
            self,
            WireError::BufferTooSmall { .. }
                | WireError::PayloadTooLarge { .. }
                | WireError::FragCount { .. }
        )
    }
}
