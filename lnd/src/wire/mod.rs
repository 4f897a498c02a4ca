//! The o2iblnd V2 wire format, byte for byte (`o2iblnd-idl.h`).
//!
//! Every o2iblnd message is a packed 48-byte header (`kib_msg`) followed by a per-type body;
//! the RDMA descriptors in PUT_ACK and GET_REQ list 12-byte fragments with misaligned 64-bit
//! addresses. The IB CM carries a CONNREQ/CONNACK message as connection private data and a
//! 24-byte [`KibRej`] when it rejects.
//!
//! # Contract
//! * **Encode in native order.** Messages are packed in the sender's byte order; this codec
//!   always packs little-endian, which is the native order of every platform the LND runs on
//!   (x86-64, aarch64), so the bytes are exactly what a kernel o2iblnd on the same host would
//!   send. ([`ByteOrder::Big`] encoders exist so tests and simulations can play a big-endian
//!   peer; the LND never uses them.)
//! * **Decode either order.** The receiver recognises a byte-swapped magic and converts every
//!   field, so decoded values are always in native order ([`Msg::order`] tells which order the
//!   sender used). Two things are never swapped, exactly as in `kiblnd_unpack_msg`:
//!   the embedded 72-byte LNet header (always little-endian, opaque here) and the **cookies**,
//!   which are opaque tokens a peer only reflects back: a cookie is the little-endian reading of
//!   its 8 wire bytes, so echoing it re-creates those bytes and the owner sees its own value
//!   whatever the peer's byte order.
//! * **Never panic on hostile bytes.** Decoding returns a typed [`WireError`], one variant per
//!   cause; no input makes it panic, index out of bounds or allocate. The codec files deny
//!   indexing, `unwrap`, `expect` and `panic!` outside tests.
//! * **No heap allocation.** The LND builds messages in place in its 4 KiB registered tx
//!   buffers: a body writer (`init_*`) when the tx is queued, then [`pack_header`] at post time
//!   with the final credits, NIDs, stamps and optional checksum. Decoding borrows the rx
//!   buffer ([`unpack`] returns views, RDMA descriptors included).
//!
//! Per-connection identity checks (the `-ESTALE` rules) are separate: [`check_conn`].
//! Which types need credits, which are requests, and every other LND policy live above this
//! module.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod cksum;
pub mod error;
pub mod msg;
pub mod rdma;
pub mod rej;

pub use cksum::{Cksum, cksum};
pub use error::WireError;
pub use msg::{
    CompletionMsg, ConnIdentity, ConnParams, GetMsg, ImmediateMsg, Msg, MsgBody, MsgHeader, MsgType,
    PutAckMsg, PutReqMsg, check_conn, get_nob, immediate_nob, init_completion, init_connparams, init_get,
    init_immediate, init_noop, init_putack, init_putreq, pack_header, putack_nob, unpack,
};
pub use rdma::{RdmaDesc, RdmaFrag, RdmaFrags, rd_size};
pub use rej::{KibRej, RejectReason};

/// `IBLND_MSG_MAGIC` (`LNET_PROTO_IB_MAGIC`): the first word of every o2iblnd message.
pub const IBLND_MSG_MAGIC: u32 = 0x0be9_1b91;

/// `LNET_PROTO_MAGIC`: the generic LNet acceptor magic (socklnd-style). A CONNREQ carrying it
/// comes from a peer speaking a future or foreign protocol; the passive side rejects it,
/// telling the peer which protocol it speaks.
pub const LNET_PROTO_MAGIC: u32 = 0x4572_6963;

/// `IBLND_MSG_VERSION_1`: the original protocol (2Q rx buffers, NOOPs cost a credit).
pub const IBLND_MSG_VERSION_1: u16 = 0x11;

/// `IBLND_MSG_VERSION_2`: the current protocol.
pub const IBLND_MSG_VERSION_2: u16 = 0x12;

/// `IBLND_MSG_VERSION`: the version this LND speaks by default.
pub const IBLND_MSG_VERSION: u16 = IBLND_MSG_VERSION_2;

/// `IBLND_MSG_SIZE`: the size of every tx and rx message buffer; no message is larger.
pub const IBLND_MSG_SIZE: usize = 4096;

/// Size of the o2iblnd message header (`offsetof(kib_msg, ibm_u)`).
pub const MSG_HDR_SIZE: usize = 48;

/// Size of the embedded LNet header (`struct lnet_hdr_nid4`), carried opaque.
pub const LNET_HDR_SIZE: usize = 72;

/// `IBLND_MAX_IMMEDIATE`: the largest IMMEDIATE payload: 4096 − 48 − 72 = 3976 bytes.
pub const IBLND_MAX_IMMEDIATE: usize = IBLND_MSG_SIZE - MSG_HDR_SIZE - LNET_HDR_SIZE;

/// `IBLND_MAX_RDMA_FRAGS`: the most fragments an RDMA descriptor may carry
/// (`LNET_MAX_IOV` 256 + 1 for an unaligned start).
pub const IBLND_MAX_RDMA_FRAGS: usize = 257;

/// Size of a CONNREQ/CONNACK message: the header plus [`ConnParams`], exactly the IB CM REQ
/// private data that `rdma_connect` leaves to the consumer.
pub const IBLND_CONNPARAMS_LEN: usize = 56;

/// Size of a `kib_rdma_frag` on the wire: `{u32 nob, u64 addr}`, packed.
pub const RDMA_FRAG_SIZE: usize = 12;

/// Size of the fixed part of a `kib_rdma_desc`: `{u32 key, u32 nfrags}`.
pub const RDMA_DESC_HDR_SIZE: usize = 8;

/// Size of `kib_rej`, the reject private data.
pub const KIB_REJ_SIZE: usize = 24;

/// Size of `kib_connparams` on the wire.
pub const CONN_PARAMS_SIZE: usize = 8;

/// The byte order a message was (or is to be) packed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ByteOrder {
    /// Least significant byte first: what this LND always sends.
    #[default]
    Little,
    /// Most significant byte first: a big-endian peer (the receiver "flips").
    Big,
}

impl ByteOrder {
    /// The order this LND packs in.
    pub const NATIVE: ByteOrder = ByteOrder::Little;

    pub(crate) fn get_u16(self, b: [u8; 2]) -> u16 {
        match self {
            ByteOrder::Little => u16::from_le_bytes(b),
            ByteOrder::Big => u16::from_be_bytes(b),
        }
    }

    pub(crate) fn get_u32(self, b: [u8; 4]) -> u32 {
        match self {
            ByteOrder::Little => u32::from_le_bytes(b),
            ByteOrder::Big => u32::from_be_bytes(b),
        }
    }

    pub(crate) fn get_u64(self, b: [u8; 8]) -> u64 {
        match self {
            ByteOrder::Little => u64::from_le_bytes(b),
            ByteOrder::Big => u64::from_be_bytes(b),
        }
    }

    pub(crate) fn put_u16(self, v: u16) -> [u8; 2] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }

    pub(crate) fn put_u32(self, v: u32) -> [u8; 4] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }

    pub(crate) fn put_u64(self, v: u64) -> [u8; 8] {
        match self {
            ByteOrder::Little => v.to_le_bytes(),
            ByteOrder::Big => v.to_be_bytes(),
        }
    }

    /// The order a 32-bit magic was written in, if `raw` (read little-endian) is `magic` in
    /// either order.
    pub(crate) fn of_magic(raw: [u8; 4], magic: u32) -> Option<ByteOrder> {
        if u32::from_le_bytes(raw) == magic {
            Some(ByteOrder::Little)
        } else if u32::from_be_bytes(raw) == magic {
            Some(ByteOrder::Big)
        } else {
            None
        }
    }
}

/// Cookies are opaque tokens: read and written little-endian whatever the message's byte
/// order, so an echoed cookie keeps its wire bytes (o2iblnd never swaps them).
pub(crate) fn get_cookie(b: [u8; 8]) -> u64 {
    u64::from_le_bytes(b)
}

/// See [`get_cookie`].
pub(crate) fn put_cookie(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

#[cfg(test)]
mod tests {
    //! Deterministic fuzzing of every decoder: random, truncated, bit-flipped and
    //! field-corrupted buffers must never panic, and whatever decodes must re-encode.
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use lnet_shim::Nid;

    use super::*;

    const SEED: u64 = 0x0be9_1b91_d0c0_ffee;
    const ITERATIONS: usize = 100_000;

    /// xorshift64: small, deterministic, good enough to shake a decoder.
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
    }

    /// A random valid message, encoded into `out` (truncated to its `nob`).
    fn gen_msg(rng: &mut XorShift, out: &mut Vec<u8>) {
        let lh: [u8; LNET_HDR_SIZE] = std::array::from_fn(|_| rng.byte());
        let nfrags =
            if rng.below(4) == 0 { 1 + rng.below(IBLND_MAX_RDMA_FRAGS as u64) } else { 1 + rng.below(4) }
                as usize;
        let frags: Vec<RdmaFrag> =
            (0..nfrags).map(|_| RdmaFrag::new(rng.next(), rng.next() as u32)).collect();
        let plen = if rng.below(4) == 0 { rng.below(IBLND_MAX_IMMEDIATE as u64 + 1) } else { rng.below(64) }
            as usize;
        let payload: Vec<u8> = (0..plen).map(|_| rng.byte()).collect();
        let cp = ConnParams {
            queue_depth: rng.next() as u16,
            max_frags: rng.next() as u16,
            max_msg_size: rng.next() as u32,
        };
        let c = CompletionMsg { cookie: rng.next(), status: rng.next() as i32 };
        let rd = RdmaDesc::new(rng.next() as u32, &frags);
        let t = MsgType::ALL[rng.below(MsgType::ALL.len() as u64) as usize];
        let body = match t {
            MsgType::ConnReq => MsgBody::ConnReq(cp),
            MsgType::ConnAck => MsgBody::ConnAck(cp),
            MsgType::Noop => MsgBody::Noop,
            MsgType::Immediate => MsgBody::Immediate(ImmediateMsg { lnet_hdr: &lh, payload: &payload }),
            MsgType::PutReq => MsgBody::PutReq(PutReqMsg { lnet_hdr: &lh, cookie: rng.next() }),
            MsgType::PutNak => MsgBody::PutNak(c),
            MsgType::PutAck => {
                MsgBody::PutAck(PutAckMsg { src_cookie: rng.next(), dst_cookie: rng.next(), rd })
            }
            MsgType::PutDone => MsgBody::PutDone(c),
            MsgType::GetReq => MsgBody::GetReq(GetMsg { lnet_hdr: &lh, cookie: rng.next(), rd }),
            MsgType::GetDone => MsgBody::GetDone(c),
        };
        let srcnid = match rng.next() {
            u64::MAX => 0,
            n => n,
        };
        let hdr = MsgHeader {
            version: if rng.below(8) == 0 { IBLND_MSG_VERSION_1 } else { IBLND_MSG_VERSION_2 },
            msg_type: t,
            credits: rng.byte(),
            nob: 0,
            cksum: 0,
            srcnid: Nid::from_u64(srcnid),
            srcstamp: rng.next(),
            dstnid: Nid::from_u64(rng.next()),
            dststamp: rng.next(),
        };
        let order = if rng.below(2) == 0 { ByteOrder::Little } else { ByteOrder::Big };
        let m = Msg { order, ..Msg::new(hdr, body) };
        out.clear();
        out.resize(IBLND_MSG_SIZE, 0);
        let nob = m.encode(out, rng.below(2) == 0).unwrap();
        out.truncate(nob as usize);
    }

    /// Decodes `bytes` every way there is and checks what decodes re-encodes faithfully.
    fn exercise(bytes: &[u8]) -> Result<bool, String> {
        let ok = match unpack(bytes) {
            Ok(m) => {
                let nob = m.hdr.nob as usize;
                if let MsgBody::PutAck(PutAckMsg { rd, .. }) | MsgBody::GetReq(GetMsg { rd, .. }) = m.body {
                    let n = rd.nfrags();
                    if n == 0 || n > IBLND_MAX_RDMA_FRAGS || rd.iter().count() != n {
                        return Err(format!("bad descriptor {rd:?}"));
                    }
                    if rd.frag(n).is_some() || rd.frag(n - 1) != rd.iter().next_back() {
                        return Err("frag() disagrees with iter()".into());
                    }
                    let _ = rd.size();
                }
                let id = ConnIdentity {
                    peer_nid: m.hdr.srcnid,
                    peer_incarnation: m.hdr.srcstamp,
                    my_nid: m.hdr.dstnid,
                    my_incarnation: m.hdr.dststamp,
                };
                if check_conn(&m.hdr, &id).is_err() {
                    return Err("check_conn refused its own identity".into());
                }
                let mut out = vec![0u8; IBLND_MSG_SIZE];
                let n2 = m
                    .encode(&mut out, m.hdr.cksum != 0)
                    .map_err(|e| format!("decoded {m:?} does not re-encode: {e}"))?
                    as usize;
                let again = unpack(&out[..n2]).map_err(|e| format!("re-encoded: {e}"))?;
                if (again.order, again.body) != (m.order, m.body)
                    || again.hdr.srcnid != m.hdr.srcnid
                    || again.hdr.credits != m.hdr.credits
                    || again.hdr.dststamp != m.hdr.dststamp
                {
                    return Err(format!("re-encode changed {m:?} into {again:?}"));
                }
                // Without trailing bytes the message re-encodes bit for bit.
                if n2 == nob && out[..nob] != bytes[..nob] {
                    return Err("re-encoded bytes differ".into());
                }
                true
            }
            Err(e) => {
                let _ = e.to_string();
                false
            }
        };
        if let Ok(r) = KibRej::decode(bytes) {
            let again = KibRej::decode(&r.encode()).map_err(|e| format!("rej: {e}"))?;
            if r.incarnation.is_some() && again != r {
                return Err(format!("rej {r:?} re-decoded as {again:?}"));
            }
        }
        let mut cp = [0u8; CONN_PARAMS_SIZE];
        for (d, s) in cp.iter_mut().zip(bytes) {
            *d = *s;
        }
        for order in [ByteOrder::Little, ByteOrder::Big] {
            if ConnParams::decode(cp, order).encode(order) != cp {
                return Err("connparams do not round trip".into());
            }
        }
        Ok(ok)
    }

    #[test]
    fn fuzz_decoders_never_panic() {
        let mut rng = XorShift(SEED);
        let mut msg = Vec::new();
        let mut decoded = 0usize;
        for i in 0..ITERATIONS {
            let mode = rng.below(7);
            let mut bytes = Vec::new();
            match mode {
                // Pure noise, mostly short, sometimes larger than any message.
                0 => {
                    let len = if rng.below(8) == 0 { rng.below(4200) } else { rng.below(160) };
                    bytes.extend((0..len).map(|_| rng.byte()));
                }
                // Noise behind a valid magic and version, in either order.
                1 => {
                    let len = rng.below(4200) as usize;
                    bytes.extend((0..len).map(|_| rng.byte()));
                    let order = if rng.below(2) == 0 { ByteOrder::Little } else { ByteOrder::Big };
                    let head = [order.put_u32(IBLND_MSG_MAGIC).as_slice(), &order.put_u16(0x12)].concat();
                    for (d, s) in bytes.iter_mut().zip(head) {
                        *d = s;
                    }
                }
                // A valid message, truncated.
                2 => {
                    gen_msg(&mut rng, &mut msg);
                    let len = rng.below(msg.len() as u64) as usize;
                    bytes.extend_from_slice(&msg[..len]);
                }
                // A valid message with a few bits flipped.
                3 => {
                    gen_msg(&mut rng, &mut msg);
                    bytes.extend_from_slice(&msg);
                    for _ in 0..1 + rng.below(4) {
                        let bit = rng.below(bytes.len() as u64 * 8) as usize;
                        bytes[bit / 8] ^= 1 << (bit % 8);
                    }
                }
                // A valid message with a header byte or a descriptor word replaced.
                4 => {
                    gen_msg(&mut rng, &mut msg);
                    bytes.extend_from_slice(&msg);
                    if rng.below(2) == 0 {
                        let at = rng.below(MSG_HDR_SIZE as u64) as usize;
                        bytes[at] = rng.byte();
                    } else {
                        let at = rng.below(bytes.len() as u64 - 3) as usize;
                        let v = match rng.below(4) {
                            0 => 0,
                            1 => 258,
                            2 => rng.below(300) as u32,
                            _ => rng.next() as u32,
                        };
                        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
                    }
                    // Sometimes drop the checksum so the corruption reaches later checks.
                    if rng.below(2) == 0 {
                        bytes[12..16].fill(0);
                    }
                }
                // A valid message followed by garbage (a full rx buffer): must decode.
                _ => {
                    gen_msg(&mut rng, &mut msg);
                    bytes.extend_from_slice(&msg);
                    let extra = rng.below(64);
                    bytes.extend((0..extra).map(|_| rng.byte()));
                }
            }
            let r = catch_unwind(AssertUnwindSafe(|| exercise(&bytes)));
            match r {
                Ok(Ok(ok)) => {
                    decoded += ok as usize;
                    assert!(
                        ok || mode < 5,
                        "seed {SEED:#x} iteration {i}: valid message refused: {:?}\n{bytes:02x?}",
                        unpack(&bytes)
                    );
                }
                Ok(Err(e)) => {
                    panic!("seed {SEED:#x} iteration {i} (mode {mode}): {e}\n{bytes:02x?}")
                }
                Err(_) => {
                    panic!("seed {SEED:#x} iteration {i} (mode {mode}): decoder panicked on {bytes:02x?}")
                }
            }
        }
        // Sanity: the generator produces mostly valid messages, so plenty decoded.
        assert!(decoded > ITERATIONS / 5, "seed {SEED:#x}: only {decoded} decoded");
    }
}
