//! RoCEv2 packet framing: the software HCA's wire codec.
//!
//! A RoCEv2 packet is the payload of a UDP datagram to port [`ROCEV2_UDP_PORT`]:
//!
//! ```text
//! BTH (12) | PAETH (8)? | DETH (8)? | RETH (16)? | AETH (4)? | ImmDt (4)? | payload | pad (0..=3) | ICRC (4)
//! ```
//!
//! This module covers:
//! * the **Base Transport Header** ([`Bth`]) and the extension headers the software device uses
//!   ([`Deth`], [`Reth`], [`Aeth`] with its [`Syndrome`], and 32-bit immediate data), all
//!   big-endian, in the IBTA order DETH, RETH, AETH, ImmDt;
//! * the **opcode table** ([`Opcode`]): RC SEND and RDMA WRITE (every FIRST/MIDDLE/LAST/ONLY
//!   form, with and without immediate), RC ACK, and UD SEND ONLY (the GSI/CM transport). Every
//!   other opcode IBTA defines (READ, atomics, UC, RD, XRC, CNP, ...) is recognised and refused
//!   with [`PacketError::UnsupportedOpcode`]; the rest are [`PacketError::UnknownOpcode`],
//!   except two of the manufacturer-specific range, 0xF0/0xF1, the software device's own
//!   same-host placed WRITE ([`Opcode::RcPlacedWrite`]; see `super::place`), and NAK code 31
//!   ([`NakCode::PlacementRefused`]) that answers it;
//! * the software device's **piggybacked ACK** ([`PiggyAck`], the 8-byte PAETH): a positive
//!   ACK for the other direction of the same connection, carried by an RC request packet
//!   (SEND, WRITE or placed WRITE) right after its BTH, flagged by bit 6 of BTH byte 8 (the
//!   top reserved bit after AckReq, covered by the ICRC). Only two software devices exchange
//!   it; IBTA hardware never sees these frames;
//! * the **pad**: `payload + pad` is a multiple of 4 ([`pad_len`]); the BTH pad count says how
//!   many zero bytes follow the payload;
//! * the **ICRC** ([`icrc`], [`seal`], [`parse`]): IEEE CRC-32 over 8 bytes of `0xFF`, the
//!   IPv4 and UDP headers and the BTH with their variant fields masked, the remaining headers,
//!   the payload and the pad; appended least-significant byte first. A userspace UDP socket
//!   does not see the IPv4 header, so the covered IPv4/UDP fields are reconstructed from an
//!   [`IcrcMeta`]. A frame that crosses only this host's memory is closed without it
//!   ([`seal_without_icrc`], the field zero) and decoded with [`parse_unchecked`];
//! * **PSN arithmetic** modulo 2^24 ([`psn_add`], [`psn_diff`], [`psn_lt`]) and the IBTA timer
//!   encodings ([`rnr_timer_duration`], [`ack_timeout_duration`]).
//!
//! # Contract
//! * **No panics on any input.** Decoding hostile bytes ([`parse`], [`parse_unchecked`]) and
//!   encoding into a caller's buffer ([`emit_headers`], [`seal`]) use checked slicing only and
//!   report every problem as a typed [`PacketError`]. Outside tests the module denies the
//!   clippy lints for indexing, `unwrap`, `expect` and `panic!`.
//! * **Strict decoding.** [`parse_unchecked`] accepts exactly the frames [`build`] can produce
//!   (up to reserved bits other than the PAETH flag, pad contents and the ICRC, which it
//!   ignores): transport version 0,
//!   a supported opcode, all of that opcode's headers present, `payload + pad` a multiple of 4,
//!   no payload on an ACK, an AETH syndrome with a defined meaning. [`parse`] additionally
//!   checks the ICRC. Any successfully parsed [`Headers`] passes [`Headers::validate`].
//! * **Strict encoding.** [`emit_headers`] and [`build`] validate the headers first
//!   ([`Headers::validate`]) and always compute the pad count themselves; reserved bits are
//!   written as zero (the PAETH flag is set exactly when a [`PiggyAck`] is present).
//! * FECN, BECN and the six reserved bits of BTH byte 4 are not covered by the ICRC (the
//!   network may set ECN marks in flight): a flip there is not detected, by design. Every other
//!   single-bit error in a frame is.
//! * Frames longer than [`MAX_FRAME_LEN`] (what fits in one IPv4 UDP datagram) are refused.
//!
//! The opcodes are in `opcode`, the headers and their stack ([`Headers`]) in `headers`, both
//! re-exported here; this file builds, seals and parses whole frames.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::net::Ipv4Addr;
use std::time::Duration;

mod headers;
mod opcode;
pub use headers::{Aeth, Bth, Deth, Headers, NakCode, PiggyAck, Reth, Syndrome};
pub use opcode::Opcode;

/// The UDP destination port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// The well-known Q_Key of the GSI (QP1), carried in the DETH of every CM MAD.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The default (full-member) partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Length of the Base Transport Header.
pub const BTH_LEN: usize = 12;
/// Length of the RDMA Extended Transport Header (VA, R_Key, DMA length).
pub const RETH_LEN: usize = 16;
/// Length of the ACK Extended Transport Header (syndrome, MSN).
pub const AETH_LEN: usize = 4;
/// Length of the Datagram Extended Transport Header (Q_Key, source QPN).
pub const DETH_LEN: usize = 8;
/// Length of the piggybacked ACK header ([`PiggyAck`]: PSN, syndrome, MSN).
pub const PAETH_LEN: usize = 8;
/// BTH byte 8, bit 6 (reserved by IBTA): a [`PiggyAck`] follows the BTH.
const PAETH_FLAG: u8 = 0x40;
/// Length of the immediate data.
pub const IMM_LEN: usize = 4;
/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;
/// PSNs (and the other 24-bit fields) live in the low 24 bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// The largest frame (UDP payload) an IPv4 UDP datagram can carry: 65535 - 20 - 8.
pub const MAX_FRAME_LEN: usize = 65_507;
/// The longest header stack of any supported opcode (RC WRITE ONLY+IMM: BTH + RETH + ImmDt).
pub const MAX_HEADER_LEN: usize = BTH_LEN + RETH_LEN + IMM_LEN;

/// Largest value of a 24-bit field.
const U24_MAX: u32 = PSN_MASK;
/// IPv4 + UDP header length, the part of the datagram in front of the frame.
const IP_UDP_LEN: usize = 20 + 8;
/// The masked pseudo-header in front of the BTH in the ICRC input: 8 x 0xFF, IPv4, UDP.
const ICRC_PREFIX_LEN: usize = 8 + IP_UDP_LEN;

fn presence(name: &'static str, wanted: bool, present: bool) -> Result<(), PacketError> {
    match (wanted, present) {
        (true, false) => Err(PacketError::MissingHeader(name)),
        (false, true) => Err(PacketError::UnexpectedHeader(name)),
        _ => Ok(()),
    }
}

fn in_range(field: &'static str, value: u64, max: u64) -> Result<(), PacketError> {
    if value > max { Err(PacketError::FieldOutOfRange { field, value }) } else { Ok(()) }
}

/// The IPv4/UDP fields the ICRC covers, reconstructed by a userspace UDP socket.
///
/// The ICRC covers the IPv4 identification, flags, addresses and the UDP ports and length.
/// A UDP socket sees none of the IPv4 header on receive, so both ends must agree on what the
/// kernel puts there: an unconnected socket with `IP_PMTUDISC_DO` sends identification 0 with
/// DF set ([`IcrcMeta::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcrcMeta {
    /// IPv4 source address.
    pub src: Ipv4Addr,
    /// IPv4 destination address.
    pub dst: Ipv4Addr,
    /// UDP source port (per-QP entropy, 0xC000..=0xFFFF on RoCEv2).
    pub src_port: u16,
    /// UDP destination port ([`ROCEV2_UDP_PORT`]).
    pub dst_port: u16,
    /// IPv4 identification.
    pub ip_id: u16,
    /// IPv4 Don't Fragment flag.
    pub dont_fragment: bool,
}

impl IcrcMeta {
    /// The fields for a datagram from `src:src_port` to `dst:dst_port` with identification 0
    /// and DF set: what an unconnected `IP_PMTUDISC_DO` socket sends.
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16) -> IcrcMeta {
        IcrcMeta { src, dst, src_port, dst_port, ip_id: 0, dont_fragment: true }
    }

    /// The ICRC pseudo-header for a frame (UDP payload) of `frame_len` bytes, ICRC included:
    /// 8 x 0xFF, the IPv4 header with TOS, TTL and checksum masked to 0xFF, and the UDP header
    /// with the checksum masked to 0xFFFF. Length fields saturate for frames longer than
    /// [`MAX_FRAME_LEN`].
    fn masked_prefix(&self, frame_len: usize) -> [u8; ICRC_PREFIX_LEN] {
        let [tl0, tl1] = len_u16(frame_len.saturating_add(IP_UDP_LEN));
        let [ul0, ul1] = len_u16(frame_len.saturating_add(8));
        let [id0, id1] = self.ip_id.to_be_bytes();
        let fl0 = if self.dont_fragment { 0x40 } else { 0 };
        let [s0, s1, s2, s3] = self.src.octets();
        let [d0, d1, d2, d3] = self.dst.octets();
        let [sp0, sp1] = self.src_port.to_be_bytes();
        let [dp0, dp1] = self.dst_port.to_be_bytes();
        #[rustfmt::skip]
        let prefix = [
            // Stand-in for the LRH.
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            // IPv4: version/IHL, TOS (masked), total length, identification, flags/fragment,
            // TTL (masked), protocol UDP, checksum (masked), source, destination.
            0x45, 0xff, tl0, tl1, id0, id1, fl0, 0x00,
            0xff, 17, 0xff, 0xff, s0, s1, s2, s3, d0, d1, d2, d3,
            // UDP: ports, length, checksum (masked).
            sp0, sp1, dp0, dp1, ul0, ul1, 0xff, 0xff,
        ];
        prefix
    }
}

fn len_u16(n: usize) -> [u8; 2] {
    u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes()
}

/// The number of pad bytes after a payload of `payload_len` bytes (0..=3).
pub fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// The full frame length (UDP payload): headers, payload, pad and ICRC. Saturates instead of
/// overflowing.
pub fn frame_len(headers: &Headers, payload_len: usize) -> usize {
    headers.len().saturating_add(payload_len).saturating_add(pad_len(payload_len)).saturating_add(ICRC_LEN)
}

/// Writes `bytes` at `frame[off..]`.
fn put(frame: &mut [u8], off: usize, bytes: &[u8]) -> Result<usize, PacketError> {
    let end = off.saturating_add(bytes.len());
    let have = frame.len();
    frame.get_mut(off..end).ok_or(PacketError::BufferTooSmall { need: end, have })?.copy_from_slice(bytes);
    Ok(end)
}

/// Reads `N` bytes at `buf[off..]`.
fn take<const N: usize>(buf: &[u8], off: usize) -> Result<[u8; N], PacketError> {
    let end = off.saturating_add(N);
    buf.get(off..end)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(PacketError::Truncated { need: end, have: buf.len() })
}

/// Writes the headers (bth.pad_count computed from payload_len, overriding the field) into
/// frame[..len]; returns the header length. The caller then writes payload_len bytes after it
/// and calls `seal`.
///
/// The headers are validated first ([`Headers::validate`]); an ACK must have no payload, and
/// the whole frame must fit in [`MAX_FRAME_LEN`]. `frame` needs room for the headers only
/// ([`PacketError::BufferTooSmall`] otherwise); [`seal`] must then be given exactly
/// [`frame_len`]`(headers, payload_len)` bytes.
pub fn emit_headers(headers: &Headers, payload_len: usize, frame: &mut [u8]) -> Result<usize, PacketError> {
    let mut h = *headers;
    // pad_len is at most 3.
    h.bth.pad_count = u8::try_from(pad_len(payload_len)).unwrap_or(0);
    h.validate()?;
    if h.bth.opcode == Opcode::RcAck && payload_len != 0 {
        return Err(PacketError::FieldOutOfRange {
            field: "ACK payload length",
            value: u64::try_from(payload_len).unwrap_or(u64::MAX),
        });
    }
    let total = frame_len(&h, payload_len);
    if total > MAX_FRAME_LEN {
        return Err(PacketError::FieldOutOfRange {
            field: "frame length",
            value: u64::try_from(total).unwrap_or(u64::MAX),
        });
    }
    let hlen = h.len();
    if frame.len() < hlen {
        return Err(PacketError::BufferTooSmall { need: hlen, have: frame.len() });
    }
    let mut bth = h.bth.encode();
    if let Some(p) = &h.piggy {
        bth[8] |= PAETH_FLAG;
        put(frame, BTH_LEN, &p.encode())?;
    }
    let mut off = put(frame, 0, &bth)? + h.piggy.map_or(0, |_| PAETH_LEN);
    if let Some(deth) = &h.deth {
        off = put(frame, off, &deth.encode())?;
    }
    if let Some(reth) = &h.reth {
        off = put(frame, off, &reth.encode())?;
    }
    if let Some(aeth) = &h.aeth {
        off = put(frame, off, &aeth.encode())?;
    }
    if let Some(imm) = h.imm {
        off = put(frame, off, &imm.to_be_bytes())?;
    }
    Ok(off)
}

/// Zeroes the pad bytes (as given by the BTH pad count already in the frame) and writes the
/// ICRC into the last 4 bytes.
///
/// `frame` is the whole frame: headers, payload, pad and room for the ICRC. Fails with
/// [`PacketError::BufferTooSmall`] if it cannot hold the opcode's headers, the pad and the
/// ICRC, and with [`PacketError::BadPad`] if the payload area does not agree with the pad
/// count (a frame of the wrong length for the `payload_len` given to [`emit_headers`]).
pub fn seal(meta: &IcrcMeta, frame: &mut [u8]) -> Result<(), PacketError> {
    finish(Some(meta), frame)
}

/// [`seal`] without the ICRC: zeroes the pad and the ICRC field, with the same checks. For a
/// frame that only crosses this host's memory ([`super::ring`], "Unsealed frames"); its
/// receiver decodes it with [`parse_unchecked`].
pub fn seal_without_icrc(frame: &mut [u8]) -> Result<(), PacketError> {
    finish(None, frame)
}

/// [`seal`] (with `meta`) or [`seal_without_icrc`] (without).
fn finish(meta: Option<&IcrcMeta>, frame: &mut [u8]) -> Result<(), PacketError> {
    let have = frame.len();
    if have > MAX_FRAME_LEN {
        return Err(PacketError::FieldOutOfRange {
            field: "frame length",
            value: u64::try_from(have).unwrap_or(u64::MAX),
        });
    }
    let bth_bytes = take::<BTH_LEN>(frame, 0)
        .map_err(|_| PacketError::BufferTooSmall { need: BTH_LEN + ICRC_LEN, have })?;
    let bth = Bth::decode(bth_bytes)?;
    let pad = usize::from(bth.pad_count);
    let hlen = stack_len(bth.opcode, bth_bytes);
    let need = hlen + pad + ICRC_LEN;
    if have < need {
        return Err(PacketError::BufferTooSmall { need, have });
    }
    let icrc_at = have - ICRC_LEN;
    let payload_len = icrc_at - pad - hlen;
    if (payload_len + pad) % 4 != 0 {
        return Err(PacketError::BadPad { pad: bth.pad_count, payload_len });
    }
    if let Some(pad_bytes) = frame.get_mut(icrc_at - pad..icrc_at) {
        pad_bytes.fill(0);
    }
    let crc = meta.map_or(0, |m| icrc(m, frame.get(..icrc_at).unwrap_or_default()));
    put(frame, icrc_at, &crc.to_le_bytes())?;
    Ok(())
}

/// The length of a frame's headers: its opcode's, plus the PAETH when the BTH flags one.
fn stack_len(op: Opcode, bth: [u8; BTH_LEN]) -> usize {
    op.header_len() + if bth[8] & PAETH_FLAG != 0 { PAETH_LEN } else { 0 }
}

/// Convenience: appends a whole sealed frame to `out`.
///
/// On error `out` is left as it was.
pub fn build(
    meta: &IcrcMeta,
    headers: &Headers,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), PacketError> {
    let start = out.len();
    let total = frame_len(headers, payload.len());
    if total > MAX_FRAME_LEN {
        return Err(PacketError::FieldOutOfRange {
            field: "frame length",
            value: u64::try_from(total).unwrap_or(u64::MAX),
        });
    }
    out.resize(start.saturating_add(total), 0);
    let result =
        out.get_mut(start..).ok_or(PacketError::BufferTooSmall { need: total, have: 0 }).and_then(|frame| {
            let hlen = emit_headers(headers, payload.len(), frame)?;
            put(frame, hlen, payload)?;
            seal(meta, frame)
        });
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// The ICRC (as the u32 whose little-endian bytes form the trailer) over a frame without its
/// ICRC.
///
/// The IPv4 and UDP length fields are computed for `frame_without_icrc.len() + ICRC_LEN`
/// bytes of UDP payload. No allocation: the hasher gets the masked pseudo-header and BTH in
/// one update and the rest of the frame in another.
pub fn icrc(meta: &IcrcMeta, frame_without_icrc: &[u8]) -> u32 {
    let frame_len = frame_without_icrc.len().saturating_add(ICRC_LEN);
    let mut head = [0u8; ICRC_PREFIX_LEN + BTH_LEN];
    let (prefix, bth) = head.split_at_mut(ICRC_PREFIX_LEN);
    prefix.copy_from_slice(&meta.masked_prefix(frame_len));
    let bth_n = frame_without_icrc.len().min(BTH_LEN);
    let (frame_bth, rest) = frame_without_icrc.split_at(bth_n);
    if let Some(dst) = bth.get_mut(..bth_n) {
        dst.copy_from_slice(frame_bth);
    }
    if bth_n > 4 {
        if let Some(b4) = bth.get_mut(4) {
            // FECN, BECN and the reserved bits are variant.
            *b4 = 0xff;
        }
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(head.get(..ICRC_PREFIX_LEN + bth_n).unwrap_or_default());
    hasher.update(rest);
    hasher.finalize()
}

/// A decoded packet, borrowing its payload from the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The BTH and extension headers.
    pub headers: Headers,
    /// The payload, without pad and ICRC.
    pub payload: &'a [u8],
}

/// Decodes a frame (UDP payload) and checks its ICRC against `meta`: every check of
/// [`parse_unchecked`] first, then [`PacketError::BadIcrc`] on a mismatch.
pub fn parse<'a>(meta: &IcrcMeta, frame: &'a [u8]) -> Result<Packet<'a>, PacketError> {
    let packet = parse_unchecked(frame)?;
    // parse_unchecked guarantees frame.len() >= BTH_LEN + ICRC_LEN.
    let (body, trailer) = frame.split_at(frame.len().saturating_sub(ICRC_LEN));
    let found = u32::from_le_bytes(take::<ICRC_LEN>(trailer, 0)?);
    let expected = icrc(meta, body);
    if expected != found {
        return Err(PacketError::BadIcrc { expected, found });
    }
    Ok(packet)
}

/// Decodes a frame (UDP payload) without checking the ICRC.
///
/// Checks, in order: the frame fits an IPv4 UDP datagram; it holds a BTH and an ICRC
/// ([`PacketError::Truncated`]); a supported opcode; transport version 0; the opcode's
/// extension headers, the pad and the ICRC fit ([`PacketError::Truncated`]); a defined AETH
/// syndrome; `payload + pad` a multiple of 4 ([`PacketError::BadPad`]); no payload on an ACK.
/// Reserved bits and pad contents are ignored.
pub fn parse_unchecked(frame: &[u8]) -> Result<Packet<'_>, PacketError> {
    let have = frame.len();
    if have > MAX_FRAME_LEN {
        return Err(PacketError::FieldOutOfRange {
            field: "frame length",
            value: u64::try_from(have).unwrap_or(u64::MAX),
        });
    }
    if have < BTH_LEN + ICRC_LEN {
        return Err(PacketError::Truncated { need: BTH_LEN + ICRC_LEN, have });
    }
    let bth_bytes = take(frame, 0)?;
    let bth = Bth::decode(bth_bytes)?;
    let op = bth.opcode;
    let hlen = stack_len(op, bth_bytes);
    let pad = usize::from(bth.pad_count);
    let need = hlen + pad + ICRC_LEN;
    if have < need {
        return Err(PacketError::Truncated { need, have });
    }
    let mut headers = Headers::new(bth);
    let mut off = BTH_LEN;
    if hlen != op.header_len() {
        if !op.is_rc_request() {
            return Err(PacketError::UnexpectedHeader("PAETH"));
        }
        headers.piggy = Some(PiggyAck::decode(take(frame, off)?)?);
        off += PAETH_LEN;
    }
    if op.has_deth() {
        headers.deth = Some(Deth::decode(take(frame, off)?));
        off += DETH_LEN;
    }
    if op.has_reth() {
        headers.reth = Some(Reth::decode(take(frame, off)?));
        off += RETH_LEN;
    }
    if op.has_aeth() {
        headers.aeth = Some(Aeth::decode(take(frame, off)?)?);
        off += AETH_LEN;
    }
    if op.has_imm() {
        headers.imm = Some(u32::from_be_bytes(take(frame, off)?));
        off += IMM_LEN;
    }
    let payload_end = have - ICRC_LEN - pad;
    let payload = frame.get(off..payload_end).ok_or(PacketError::Truncated { need, have })?;
    if (payload.len() + pad) % 4 != 0 {
        return Err(PacketError::BadPad { pad: bth.pad_count, payload_len: payload.len() });
    }
    if op == Opcode::RcAck && !payload.is_empty() {
        return Err(PacketError::FieldOutOfRange {
            field: "ACK payload length",
            value: u64::try_from(payload.len()).unwrap_or(u64::MAX),
        });
    }
    Ok(Packet { headers, payload })
}

/// `psn + n` modulo 2^24.
pub const fn psn_add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// The signed distance `a - b` modulo 2^24, in `[-2^23, 2^23)`.
pub const fn psn_diff(a: u32, b: u32) -> i32 {
    let d = a.wrapping_sub(b) & PSN_MASK;
    // Sign-extend the 24-bit difference.
    ((d << 8) as i32) >> 8
}

/// Whether `a` comes before `b` in PSN order (`psn_diff(a, b) < 0`).
pub const fn psn_lt(a: u32, b: u32) -> bool {
    psn_diff(a, b) < 0
}

/// RNR NAK timer codes in microseconds (the IBTA encoding of the 5-bit AETH timer field).
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120,
    7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680,
    491_520,
];

/// RNR NAK timer code (0..=31) -> duration (table in the reference: 0 = 655.36 ms, 1 = 0.01 ms,
/// ...). Codes above 31 clamp to 31 (491.52 ms).
pub fn rnr_timer_duration(code: u8) -> Duration {
    let us = RNR_TIMER_US.get(usize::from(code.min(31))).copied().unwrap_or(491_520);
    Duration::from_micros(u64::from(us))
}

/// Local ACK timeout code -> 4.096 us * 2^code; None for 0 (infinite). Codes > 31 clamp to 31.
pub fn ack_timeout_duration(code: u8) -> Option<Duration> {
    if code == 0 {
        return None;
    }
    Some(Duration::from_nanos(4_096u64 << code.min(31)))
}

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PacketError {
    /// The frame ends before the headers, pad and ICRC its BTH announces.
    #[error("truncated frame: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// An opcode IBTA does not define (reserved or manufacturer-specific).
    #[error("unknown BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// An opcode IBTA defines but the software device does not implement (READ, atomics, UC,
    /// RD, XRC, CNP, ...).
    #[error("unsupported BTH opcode {0:#04x}")]
    UnsupportedOpcode(u8),
    /// The BTH transport header version is not 0.
    #[error("bad BTH transport version {0}")]
    BadTransportVersion(u8),
    /// The payload plus the pad is not a multiple of 4.
    #[error("bad pad count {pad} for a {payload_len}-byte payload")]
    BadPad {
        /// Pad count from the BTH.
        pad: u8,
        /// Payload bytes (frame minus headers, pad and ICRC).
        payload_len: usize,
    },
    /// The ICRC trailer does not match the frame.
    #[error("bad ICRC: computed {expected:#010x}, frame has {found:#010x}")]
    BadIcrc {
        /// The ICRC computed over the frame.
        expected: u32,
        /// The ICRC in the trailer.
        found: u32,
    },
    /// An AETH syndrome with no defined meaning (bit 7 set, reserved type, unknown NAK code).
    #[error("bad AETH syndrome {0:#04x}")]
    BadSyndrome(u8),
    /// The opcode needs this extension header but the headers lack it.
    #[error("opcode requires a {0} header")]
    MissingHeader(&'static str),
    /// The headers carry an extension header the opcode does not have.
    #[error("opcode does not carry a {0} header")]
    UnexpectedHeader(&'static str),
    /// The output buffer is too short.
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A field holds a value its wire encoding cannot carry (a QPN, PSN or MSN above 2^24, a
    /// 5-bit code above 31, a payload on an ACK, a frame above [`MAX_FRAME_LEN`]).
    #[error("{field} out of range: {value}")]
    FieldOutOfRange {
        /// Which field.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
}

#[cfg(test)]
mod tests;
