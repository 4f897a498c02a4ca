//! `roce_packet`: the RoCEv2 frame codec (`lnd::fabric::soft::packet`).
//!
//! Input: one control byte, then the frame (UDP payload, BTH .. ICRC). Bit 0 of the control
//! byte re-seals the frame (recomputes the ICRC over it for [`meta`]) before decoding, so that
//! mutations get past the CRC and reach the header checks of [`parse`]; otherwise the frame is
//! decoded as given, ICRC and all.
//!
//! Contract checked (the module's "Contract" section):
//! * [`parse`] and [`parse_unchecked`] never panic; they agree (same packet, or the same error,
//!   or `parse` adds only [`PacketError::BadIcrc`]);
//! * a decoded packet passes [`Headers::validate`], its header stack has the opcode's length
//!   (plus [`PAETH_LEN`] with a piggybacked ACK, only ever on an RC request opcode), and
//!   headers + payload + pad + ICRC account for every byte of the frame;
//! * re-encoding it with [`build`] gives a frame of the same length that decodes to the same
//!   packet and equals the input except in reserved bits, pad bytes and the ICRC;
//! * [`seal`] never panics, and a frame it sealed that [`parse_unchecked`] accepts passes the
//!   ICRC check of [`parse`].

use std::net::Ipv4Addr;

use lnd::fabric::soft::packet::{
    BTH_LEN, Headers, ICRC_LEN, IcrcMeta, MAX_FRAME_LEN, Opcode, PAETH_LEN, PacketError, ROCEV2_UDP_PORT,
    build, icrc, pad_len, parse, parse_unchecked, seal,
};

/// Control bit: recompute the ICRC before decoding.
pub const RESEAL: u8 = 1;

/// The IPv4/UDP fields every frame of this target is checked against.
pub fn meta() -> IcrcMeta {
    IcrcMeta::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 0xc123, ROCEV2_UDP_PORT)
}

/// Writes the ICRC of `frame[..len - 4]` into its last four bytes (no other change).
pub fn reseal(meta: &IcrcMeta, frame: &mut [u8]) {
    if let Some(body_len) = frame.len().checked_sub(ICRC_LEN) {
        let crc = icrc(meta, &frame[..body_len]);
        frame[body_len..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// The fuzz target.
pub fn run(data: &[u8]) {
    let Some((&ctl, frame)) = data.split_first() else {
        return;
    };
    let meta = meta();
    let mut frame = frame.to_vec();
    if ctl & RESEAL != 0 {
        reseal(&meta, &mut frame);
    }
    check(&meta, &frame);

    // seal() on arbitrary bytes: never panics; what it seals passes the ICRC check.
    let mut sealed = frame.clone();
    if seal(&meta, &mut sealed).is_ok() && parse_unchecked(&sealed).is_ok() {
        let r = parse(&meta, &sealed);
        assert!(r.is_ok(), "seal() produced a frame parse() refuses: {r:?}");
    }
}

fn check(meta: &IcrcMeta, frame: &[u8]) {
    let unchecked = parse_unchecked(frame);
    let checked = parse(meta, frame);
    match (&checked, &unchecked) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "parse and parse_unchecked disagree"),
        (Err(PacketError::BadIcrc { expected, found }), Ok(_)) => {
            assert_ne!(expected, found);
            let trailer = &frame[frame.len() - ICRC_LEN..];
            assert_eq!(u32::from_le_bytes(trailer.try_into().unwrap()), *found);
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "parse and parse_unchecked fail differently"),
        _ => panic!("parse {checked:?} but parse_unchecked {unchecked:?}"),
    }
    // Error values format without panicking.
    if let Err(e) = &checked {
        let _ = e.to_string();
    }
    let Ok(pkt) = unchecked else {
        return;
    };
    let h = pkt.headers;
    let op = h.bth.opcode;
    assert_eq!(Opcode::from_u8(op.as_u8()), Ok(op));
    h.validate().unwrap_or_else(|e| panic!("decoded headers fail validate(): {e} {h:?}"));
    assert_eq!(h.len(), op.header_len() + h.piggy.map_or(0, |_| PAETH_LEN));
    assert!(h.piggy.is_none() || op.is_rc_request(), "a piggybacked ACK on {op:?}");
    assert!(frame.len() <= MAX_FRAME_LEN);
    let pad = usize::from(h.bth.pad_count);
    assert_eq!(pad, pad_len(pkt.payload.len()), "pad count does not complete the payload");
    assert_eq!(h.len() + pkt.payload.len() + pad + ICRC_LEN, frame.len(), "bytes unaccounted for");
    // The payload is the frame's own bytes right after the headers.
    assert_eq!(pkt.payload, &frame[h.len()..h.len() + pkt.payload.len()]);
    if op == Opcode::RcAck {
        assert!(pkt.payload.is_empty());
    }

    // Re-encode and decode again.
    let mut out = Vec::new();
    build(meta, &h, pkt.payload, &mut out)
        .unwrap_or_else(|e| panic!("decoded packet does not re-encode: {e}"));
    assert_eq!(out.len(), frame.len(), "re-encoded frame has another length");
    let again = parse(meta, &out).unwrap_or_else(|e| panic!("re-encoded frame does not decode: {e}"));
    assert_eq!(again, pkt, "re-encoded frame decodes differently");
    // Bit for bit, except reserved bits, pad bytes and the ICRC.
    let covered = h.len() + pkt.payload.len();
    for (i, (&a, &b)) in out[..covered].iter().zip(&frame[..covered]).enumerate() {
        if h.piggy.is_some() && i == BTH_LEN + 4 {
            // The PAETH syndrome: any ACK is accepted, "ACK, no credit information" written.
            assert_eq!((a, b >> 5), (0x1f, 0), "PAETH syndrome {b:#04x} re-encoded as {a:#04x}");
            continue;
        }
        let mask = reserved_mask(&h, i);
        assert_eq!(a & !mask, b & !mask, "byte {i} differs after re-encoding: {a:#04x} vs {b:#04x}");
        assert_eq!(a & mask, 0, "reserved bits written at byte {i}");
    }
    assert!(out[covered..covered + pad].iter().all(|&b| b == 0), "pad not zero");
}

/// The reserved (ignored on receipt, written as zero) bits of byte `i` of a frame with
/// headers `h`.
fn reserved_mask(h: &Headers, i: usize) -> u8 {
    let piggy = h.piggy.is_some();
    match i {
        // BTH byte 1: SE, M, pad count, TVer (checked to be 0): nothing reserved.
        // BTH byte 4: FECN, BECN, then 6 reserved bits.
        4 => 0x3f,
        // BTH byte 8: AckReq, the PAETH flag, then 6 reserved bits.
        8 => 0x3f,
        // PAETH byte 0 is reserved.
        12 if piggy => 0xff,
        // DETH byte 4 (frame byte 16) is reserved.
        16 if h.bth.opcode.has_deth() => 0xff,
        _ if i < BTH_LEN => 0,
        _ => 0,
    }
}
