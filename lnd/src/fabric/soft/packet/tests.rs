//! Bit-exact header images, build/parse round trips over every opcode, the ICRC against
//! known frames, single-bit error detection, and hostile frames.

use super::*;

const ALL_OPCODES: [Opcode; 17] = [
    Opcode::RcSendFirst,
    Opcode::RcSendMiddle,
    Opcode::RcSendLast,
    Opcode::RcSendLastImm,
    Opcode::RcSendOnly,
    Opcode::RcSendOnlyImm,
    Opcode::RcWriteFirst,
    Opcode::RcWriteMiddle,
    Opcode::RcWriteLast,
    Opcode::RcWriteLastImm,
    Opcode::RcWriteOnly,
    Opcode::RcWriteOnlyImm,
    Opcode::RcAck,
    Opcode::UdSendOnly,
    Opcode::UdSendOnlyImm,
    Opcode::RcPlacedWrite,
    Opcode::RcPlacedWriteImm,
];

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex string {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// SplitMix64: a tiny deterministic generator for the property and fuzz tests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn u32(&mut self) -> u32 {
        self.next() as u32
    }
    fn u24(&mut self) -> u32 {
        self.u32() & PSN_MASK
    }
    fn bool(&mut self) -> bool {
        self.next() & 1 == 1
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn meta() -> IcrcMeta {
    IcrcMeta::new(Ipv4Addr::new(192, 168, 1, 2), Ipv4Addr::new(192, 168, 1, 1), 0xc002, ROCEV2_UDP_PORT)
}

/// Valid headers for `op` with every field drawn from `rng` (syndromes included).
fn random_headers(op: Opcode, rng: &mut Rng) -> Headers {
    let mut bth = Bth::new(op, rng.u24(), rng.u24());
    bth.solicited = rng.bool();
    bth.mig_req = rng.bool();
    bth.pkey = rng.next() as u16;
    bth.fecn = rng.bool();
    bth.becn = rng.bool();
    bth.ack_req = rng.bool();
    let mut h = Headers::new(bth);
    if op.has_deth() {
        h.deth = Some(Deth { qkey: rng.u32(), src_qp: rng.u24() });
    }
    if op.has_reth() {
        h.reth = Some(Reth { va: rng.next(), rkey: rng.u32(), dma_len: rng.u32() });
    }
    if op.has_aeth() {
        let low = (rng.next() & 0x1f) as u8;
        let syndrome = match rng.below(3) {
            0 => Syndrome::Ack { credit_code: low },
            1 => Syndrome::RnrNak { timer: low },
            _ => Syndrome::Nak(NakCode::from_code(low % 5).unwrap()),
        };
        h.aeth = Some(Aeth { syndrome, msn: rng.u24() });
    }
    if op.has_imm() {
        h.imm = Some(rng.u32());
    }
    if op.is_rc_request() && rng.bool() {
        h.piggy = Some(PiggyAck { psn: rng.u24(), msn: rng.u24() });
    }
    h
}

/// The headers as `parse` returns them after `build`: pad count filled in.
fn with_pad(h: &Headers, payload_len: usize) -> Headers {
    let mut h = *h;
    h.bth.pad_count = pad_len(payload_len) as u8;
    h
}

fn built(meta: &IcrcMeta, h: &Headers, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    build(meta, h, payload, &mut out).unwrap();
    out
}

// ----- ICRC vectors -----

#[test]
fn icrc_connectx_cnp_vector() {
    let ip = hex("45c2003c718c4000401191610a0011010a001201");
    let udp = hex("000012b700280000");
    let mut frame = hex("8100ffff40000118");
    frame.extend_from_slice(&[0; 4 + 16]);
    let trailer = hex("82fd002a");
    let meta = IcrcMeta {
        src: Ipv4Addr::new(10, 0, 17, 1),
        dst: Ipv4Addr::new(10, 0, 18, 1),
        // The captured UDP header has source port 0.
        src_port: 0,
        dst_port: ROCEV2_UDP_PORT,
        ip_id: 0x718c,
        dont_fragment: true,
    };
    // The reconstructed pseudo-header equals the captured headers, masked.
    let mut masked = vec![0xff; 8];
    masked.extend_from_slice(&ip);
    masked.extend_from_slice(&udp);
    for i in [8 + 1, 8 + 8, 8 + 10, 8 + 11, 8 + 20 + 6, 8 + 20 + 7] {
        masked[i] = 0xff;
    }
    assert_eq!(meta.masked_prefix(frame.len() + ICRC_LEN).to_vec(), masked);
    let crc = icrc(&meta, &frame);
    assert_eq!(crc, 0x2A00_FD82);
    assert_eq!(crc.to_le_bytes().to_vec(), trailer);
    // CNP is recognised but not implemented.
    let mut whole = frame.clone();
    whole.extend_from_slice(&trailer);
    assert_eq!(parse(&meta, &whole), Err(PacketError::UnsupportedOpcode(0x81)));
}

#[test]
fn icrc_derived_rc_ack_vector() {
    let meta = meta();
    assert_eq!((meta.ip_id, meta.dont_fragment), (0, true));
    let body = hex("1100ffff00000011001234561f000001");
    let masked = hex("ffffffffffffffff45ff003000004000ff11ffffc0a80102c0a80101c00212b7001cffff\
         1100ffffff000011001234561f000001");
    let mut input = meta.masked_prefix(body.len() + ICRC_LEN).to_vec();
    input.extend_from_slice(&body[..BTH_LEN]);
    input[ICRC_PREFIX_LEN + 4] = 0xff;
    input.extend_from_slice(&body[BTH_LEN..]);
    assert_eq!(input, masked);
    assert_eq!(icrc(&meta, &body), 0x3D4D_6070);

    let mut h = Headers::new(Bth::new(Opcode::RcAck, 0x11, 0x12_3456));
    h.aeth = Some(Aeth { syndrome: Syndrome::Ack { credit_code: 0x1f }, msn: 1 });
    let frame = built(&meta, &h, &[]);
    let mut expected = body.clone();
    expected.extend_from_slice(&hex("70604d3d"));
    assert_eq!(frame, expected);
    assert_eq!(frame.len(), frame_len(&h, 0));
    let p = parse(&meta, &frame).unwrap();
    assert_eq!(p.headers, h);
    assert!(p.payload.is_empty());
    // The same frame under another IP identification fails the check.
    let other = IcrcMeta { ip_id: 1, ..meta };
    assert_eq!(
        parse(&other, &frame),
        Err(PacketError::BadIcrc { expected: icrc(&other, &body), found: 0x3D4D_6070 })
    );
    assert!(parse_unchecked(&frame).is_ok());
}

#[test]
fn a_frame_sealed_without_icrc_decodes_unchecked_only() {
    let meta = IcrcMeta::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 4791, 4791);
    let headers = Headers::new(Bth::new(Opcode::RcSendOnly, 3, 9));
    let mut f = Vec::new();
    build(&meta, &headers, b"abc", &mut f).unwrap();
    let sealed = f.clone();
    // A stale pad byte is zeroed, as by `seal`.
    let pad_at = f.len() - ICRC_LEN - 1;
    f[pad_at] = 0xAA;
    seal_without_icrc(&mut f).unwrap();
    assert_eq!(&f[f.len() - ICRC_LEN..], &[0; ICRC_LEN]);
    assert_eq!(f[..f.len() - ICRC_LEN], sealed[..sealed.len() - ICRC_LEN]);
    assert_eq!(parse_unchecked(&f).unwrap().payload, b"abc");
    assert!(matches!(parse(&meta, &f), Err(PacketError::BadIcrc { found: 0, .. })));
    // The same checks as `seal`.
    assert!(seal_without_icrc(&mut f[..BTH_LEN]).is_err());
}

#[test]
fn icrc_ignores_ecn_bits_and_covers_everything_else() {
    let meta = meta();
    let mut h = Headers::new(Bth::new(Opcode::RcSendOnly, 7, 9));
    h.bth.fecn = true;
    let a = built(&meta, &h, b"hello");
    h.bth.fecn = false;
    h.bth.becn = true;
    let b = built(&meta, &h, b"hello");
    assert_eq!(a[a.len() - 4..], b[b.len() - 4..]);
    // Every covered meta field changes the ICRC.
    let body = &a[..a.len() - ICRC_LEN];
    let base = icrc(&meta, body);
    let variants = [
        IcrcMeta { src: Ipv4Addr::new(192, 168, 1, 3), ..meta },
        IcrcMeta { dst: Ipv4Addr::new(192, 168, 1, 3), ..meta },
        IcrcMeta { src_port: 0xc003, ..meta },
        IcrcMeta { dst_port: 4792, ..meta },
        IcrcMeta { ip_id: 0x8000, ..meta },
        IcrcMeta { dont_fragment: false, ..meta },
    ];
    for v in variants {
        assert_ne!(icrc(&v, body), base, "{v:?}");
    }
    // Degenerate inputs do not panic.
    for n in 0..=BTH_LEN + 1 {
        let _ = icrc(&meta, &a[..n]);
    }
}

// ----- opcodes and syndromes -----

#[test]
fn opcode_table() {
    for op in ALL_OPCODES {
        assert_eq!(Opcode::from_u8(op.as_u8()), Ok(op));
        let expect_len = BTH_LEN
            + usize::from(op.has_deth()) * DETH_LEN
            + usize::from(op.has_reth()) * RETH_LEN
            + usize::from(op.has_aeth()) * AETH_LEN
            + usize::from(op.has_imm()) * IMM_LEN;
        assert_eq!(op.header_len(), expect_len, "{op:?}");
        assert!(op.header_len() <= MAX_HEADER_LEN);
        assert!(!(op.is_send() && op.is_write()));
        assert_eq!(op.is_send(), op.as_u8() <= 0x05, "{op:?}");
        assert_eq!(op.is_write(), (0x06..=0x0b).contains(&op.as_u8()), "{op:?}");
    }
    // Header sizes from the reference table.
    let lens = [
        (Opcode::RcSendFirst, 12),
        (Opcode::RcSendLastImm, 16),
        (Opcode::RcSendOnlyImm, 16),
        (Opcode::RcWriteFirst, 28),
        (Opcode::RcWriteMiddle, 12),
        (Opcode::RcWriteLastImm, 16),
        (Opcode::RcWriteOnly, 28),
        (Opcode::RcWriteOnlyImm, 32),
        (Opcode::RcAck, 16),
        (Opcode::UdSendOnly, 20),
        (Opcode::UdSendOnlyImm, 24),
        (Opcode::RcPlacedWrite, 28),
        (Opcode::RcPlacedWriteImm, 32),
    ];
    for (op, len) in lens {
        assert_eq!(op.header_len(), len, "{op:?}");
    }
    let firsts = ALL_OPCODES.iter().filter(|o| o.is_first()).count();
    let lasts = ALL_OPCODES.iter().filter(|o| o.is_last()).count();
    assert_eq!((firsts, lasts), (10, 12));
    assert!(!Opcode::RcAck.is_first() && !Opcode::RcAck.is_last());
    assert!(!Opcode::RcSendMiddle.is_first() && !Opcode::RcSendMiddle.is_last());

    let mut supported = 0;
    for b in 0..=255u8 {
        match Opcode::from_u8(b) {
            Ok(op) => {
                supported += 1;
                assert_eq!(op.as_u8(), b);
            }
            Err(PacketError::UnsupportedOpcode(x)) => assert_eq!(x, b),
            Err(PacketError::UnknownOpcode(x)) => assert_eq!(x, b),
            Err(e) => panic!("{b:#x}: {e}"),
        }
    }
    assert_eq!(supported, ALL_OPCODES.len());
    for b in
        [0x0c, 0x0d, 0x10, 0x12, 0x13, 0x14, 0x16, 0x17, 0x1c, 0x1d, 0x20, 0x2b, 0x40, 0x55, 0x81, 0xa0, 0xb7]
    {
        assert_eq!(Opcode::from_u8(b), Err(PacketError::UnsupportedOpcode(b)), "{b:#x}");
    }
    for b in
        [0x15, 0x18, 0x1b, 0x1e, 0x2c, 0x3f, 0x60, 0x63, 0x66, 0x80, 0x82, 0xb5, 0xc0, 0xe0, 0xef, 0xf2, 0xff]
    {
        assert_eq!(Opcode::from_u8(b), Err(PacketError::UnknownOpcode(b)), "{b:#x}");
    }
}

#[test]
fn syndrome_encoding() {
    let mut ok = 0;
    for b in 0..=255u8 {
        match Syndrome::from_u8(b) {
            Ok(s) => {
                ok += 1;
                assert_eq!(s.to_u8(), b);
            }
            Err(e) => assert_eq!(e, PacketError::BadSyndrome(b)),
        }
    }
    assert_eq!(ok, 32 + 32 + 6);
    assert_eq!(Syndrome::from_u8(0x7f), Ok(Syndrome::Nak(NakCode::PlacementRefused)));
    assert_eq!(Syndrome::from_u8(0x1f), Ok(Syndrome::Ack { credit_code: 0x1f }));
    assert_eq!(Syndrome::from_u8(0x2e), Ok(Syndrome::RnrNak { timer: 14 }));
    assert_eq!(Syndrome::from_u8(0x60), Ok(Syndrome::Nak(NakCode::PsnSequenceError)));
    assert_eq!(Syndrome::from_u8(0x62), Ok(Syndrome::Nak(NakCode::RemoteAccessError)));
    assert_eq!(Syndrome::from_u8(0x64), Ok(Syndrome::Nak(NakCode::InvalidRdRequest)));
    assert_eq!(Syndrome::from_u8(0x65), Err(PacketError::BadSyndrome(0x65)));
    assert_eq!(Syndrome::from_u8(0x40), Err(PacketError::BadSyndrome(0x40)));
    assert_eq!(Syndrome::from_u8(0x80), Err(PacketError::BadSyndrome(0x80)));
    assert_eq!(Syndrome::Nak(NakCode::RemoteOperationalError).to_u8(), 0x63);
    assert_eq!(Syndrome::Nak(NakCode::InvalidRequest).to_u8(), 0x61);
}

// ----- round trips -----

#[test]
fn round_trip_every_opcode_and_pad() {
    let meta = meta();
    let mut rng = Rng(0x0ddb_a115_eed0);
    let lens = [0usize, 1, 2, 3, 4, 5, 6, 7, 8, 255, 256, 257, 1023, 1024, 2048, 4093, 4094, 4095, 4096];
    for op in ALL_OPCODES {
        for &len in &lens {
            let h = random_headers(op, &mut rng);
            let payload = rng.bytes(len);
            if op == Opcode::RcAck && len != 0 {
                let mut out = vec![1, 2, 3];
                assert!(matches!(
                    build(&meta, &h, &payload, &mut out),
                    Err(PacketError::FieldOutOfRange { field: "ACK payload length", .. })
                ));
                assert_eq!(out, [1, 2, 3], "failed build leaves out unchanged");
                continue;
            }
            let frame = built(&meta, &h, &payload);
            assert_eq!(frame.len(), frame_len(&h, len));
            assert_eq!(frame.len() % 4, 0, "{op:?} {len}");
            let pad = pad_len(len);
            assert!((len + pad) % 4 == 0 && pad <= 3);
            assert_eq!(usize::from((frame[1] >> 4) & 3), pad);
            let pad_area = &frame[frame.len() - ICRC_LEN - pad..frame.len() - ICRC_LEN];
            assert!(pad_area.iter().all(|&b| b == 0));
            let p = parse(&meta, &frame).unwrap_or_else(|e| panic!("{op:?} len {len}: {e}"));
            assert_eq!(p.headers, with_pad(&h, len), "{op:?} len {len}");
            assert_eq!(p.payload, &payload[..]);
            assert_eq!(parse_unchecked(&frame), Ok(p));

            // emit_headers + payload + seal produce the same bytes, and ignore the
            // caller's pad count and stale pad bytes.
            let mut h2 = h;
            h2.bth.pad_count = 3 - (pad as u8);
            let mut manual = vec![0xaa; frame_len(&h, len)];
            let hlen = emit_headers(&h2, len, &mut manual).unwrap();
            assert_eq!(hlen, h.len());
            assert_eq!(hlen, op.header_len() + h.piggy.map_or(0, |_| PAETH_LEN));
            manual[hlen..hlen + len].copy_from_slice(&payload);
            seal(&meta, &mut manual).unwrap();
            assert_eq!(manual, frame, "{op:?} len {len}");
        }
    }
}

#[test]
fn build_appends() {
    let meta = meta();
    let h = Headers::new(Bth::new(Opcode::RcSendOnly, 1, 2));
    let mut out = b"prefix".to_vec();
    build(&meta, &h, b"abc", &mut out).unwrap();
    assert_eq!(&out[..6], b"prefix");
    assert_eq!(parse(&meta, &out[6..]).unwrap().payload, b"abc");
}

#[test]
fn mtu_payloads_and_max_frame() {
    let meta = meta();
    let mut rng = Rng(77);
    for op in [Opcode::RcSendMiddle, Opcode::RcWriteFirst, Opcode::UdSendOnly] {
        for mtu in [256usize, 512, 1024, 2048, 4096] {
            let h = random_headers(op, &mut rng);
            let payload = rng.bytes(mtu);
            let frame = built(&meta, &h, &payload);
            assert_eq!(frame.len(), h.len() + mtu + ICRC_LEN);
            assert_eq!(parse(&meta, &frame).unwrap().payload, &payload[..]);
        }
    }
    // The largest frame that fits an IPv4 datagram, and one byte more.
    let h = Headers::new(Bth::new(Opcode::RcSendOnly, 1, 1));
    // Frames are multiples of 4, so the longest is 65504 bytes.
    let max_payload = (MAX_FRAME_LEN & !3) - BTH_LEN - ICRC_LEN;
    assert_eq!(frame_len(&h, max_payload), 65_504);
    assert!(frame_len(&h, max_payload + 1) > MAX_FRAME_LEN);
    let payload = vec![0x5a; max_payload + 4];
    let frame = built(&meta, &h, &payload[..max_payload]);
    assert_eq!(parse(&meta, &frame).unwrap().payload.len(), max_payload);
    let mut out = Vec::new();
    assert!(matches!(
        build(&meta, &h, &payload[..max_payload + 1], &mut out),
        Err(PacketError::FieldOutOfRange { field: "frame length", .. })
    ));
    assert!(out.is_empty());
    let mut big = frame.clone();
    big.extend_from_slice(&[0; 4]);
    assert!(matches!(parse_unchecked(&big), Err(PacketError::FieldOutOfRange { .. })));
    assert!(matches!(seal(&meta, &mut big), Err(PacketError::FieldOutOfRange { .. })));
    assert_eq!(frame_len(&h, usize::MAX), usize::MAX);
}

#[test]
fn fields_at_their_limits() {
    let meta = meta();
    for (lo, bit) in [(0u32, false), (PSN_MASK, true)] {
        let wide = if bit { u32::MAX } else { 0 };
        for op in ALL_OPCODES {
            let mut h = Headers::new(Bth {
                opcode: op,
                solicited: bit,
                mig_req: bit,
                pad_count: 0,
                pkey: wide as u16,
                fecn: bit,
                becn: bit,
                dest_qp: lo,
                ack_req: bit,
                psn: lo,
            });
            if op.has_deth() {
                h.deth = Some(Deth { qkey: wide, src_qp: lo });
            }
            if op.has_reth() {
                h.reth = Some(Reth { va: if bit { u64::MAX } else { 0 }, rkey: wide, dma_len: wide });
            }
            if op.has_aeth() {
                let syndrome =
                    if bit { Syndrome::RnrNak { timer: 31 } } else { Syndrome::Ack { credit_code: 0 } };
                h.aeth = Some(Aeth { syndrome, msn: lo });
            }
            if op.has_imm() {
                h.imm = Some(wide);
            }
            let payload = if op == Opcode::RcAck { &[][..] } else { &b"xyz"[..] };
            let frame = built(&meta, &h, payload);
            let p = parse(&meta, &frame).unwrap();
            assert_eq!(p.headers, with_pad(&h, payload.len()), "{op:?}");
            if bit {
                // All-ones fields: the BTH bytes are exactly those bits, reserved bits zero.
                assert_eq!(frame[0], op.as_u8());
                assert_eq!(frame[1], 0xc0 | ((pad_len(payload.len()) as u8) << 4));
                assert_eq!(&frame[2..12], &[0xff, 0xff, 0xc0, 0xff, 0xff, 0xff, 0x80, 0xff, 0xff, 0xff]);
            }
        }
    }
    // One past each 24-bit (and 5-bit, 2-bit) limit is refused, by validate and emit.
    let over = PSN_MASK + 1;
    let mut buf = [0u8; 64];
    let cases: Vec<(Headers, &str)> = vec![
        (Headers::new(Bth::new(Opcode::RcSendOnly, over, 0)), "BTH dest_qp"),
        (Headers::new(Bth::new(Opcode::RcSendOnly, 0, over)), "BTH psn"),
        (
            Headers {
                deth: Some(Deth { qkey: GSI_QKEY, src_qp: over }),
                ..Headers::new(Bth::new(Opcode::UdSendOnly, 1, 0))
            },
            "DETH src_qp",
        ),
        (
            Headers {
                aeth: Some(Aeth { syndrome: Syndrome::Ack { credit_code: 0 }, msn: over }),
                ..Headers::new(Bth::new(Opcode::RcAck, 1, 0))
            },
            "AETH msn",
        ),
        (
            Headers {
                aeth: Some(Aeth { syndrome: Syndrome::Ack { credit_code: 32 }, msn: 0 }),
                ..Headers::new(Bth::new(Opcode::RcAck, 1, 0))
            },
            "AETH credit code",
        ),
        (
            Headers {
                aeth: Some(Aeth { syndrome: Syndrome::RnrNak { timer: 32 }, msn: 0 }),
                ..Headers::new(Bth::new(Opcode::RcAck, 1, 0))
            },
            "AETH RNR timer",
        ),
    ];
    for (h, field) in cases {
        let err = h.validate().unwrap_err();
        assert!(matches!(err, PacketError::FieldOutOfRange { field: f, .. } if f == field), "{field}: {err}");
        assert_eq!(emit_headers(&h, 0, &mut buf), Err(err));
    }
    let mut h = Headers::new(Bth::new(Opcode::RcSendOnly, 0, 0));
    h.bth.pad_count = 4;
    assert_eq!(h.validate(), Err(PacketError::FieldOutOfRange { field: "BTH pad_count", value: 4 }));
    // emit_headers computes the pad count itself.
    assert_eq!(emit_headers(&h, 0, &mut buf), Ok(BTH_LEN));
}

#[test]
fn header_presence_must_match_opcode() {
    let mut rng = Rng(5);
    for op in ALL_OPCODES {
        let good = random_headers(op, &mut rng);
        assert_eq!(good.validate(), Ok(()));
        assert_eq!(good.len(), op.header_len() + good.piggy.map_or(0, |_| PAETH_LEN));
        if !op.is_rc_request() {
            let h = Headers { piggy: Some(PiggyAck { psn: 1, msn: 2 }), ..good };
            assert_eq!(h.validate(), Err(PacketError::UnexpectedHeader("PAETH")), "{op:?}");
        }
        let deth = Some(Deth { qkey: 1, src_qp: 2 });
        let reth = Some(Reth { va: 1, rkey: 2, dma_len: 3 });
        let aeth = Some(Aeth { syndrome: Syndrome::Ack { credit_code: 1 }, msn: 2 });
        let toggles: [(Headers, &str, bool); 4] = [
            (Headers { deth: if good.deth.is_some() { None } else { deth }, ..good }, "DETH", op.has_deth()),
            (Headers { reth: if good.reth.is_some() { None } else { reth }, ..good }, "RETH", op.has_reth()),
            (Headers { aeth: if good.aeth.is_some() { None } else { aeth }, ..good }, "AETH", op.has_aeth()),
            (Headers { imm: if good.imm.is_some() { None } else { Some(9) }, ..good }, "ImmDt", op.has_imm()),
        ];
        for (h, name, has) in toggles {
            let want =
                if has { PacketError::MissingHeader(name) } else { PacketError::UnexpectedHeader(name) };
            assert_eq!(h.validate(), Err(want.clone()), "{op:?} {name}");
            assert_eq!(emit_headers(&h, 0, &mut [0; 64]), Err(want), "{op:?} {name}");
        }
    }
}

#[test]
fn buffer_errors_on_encode() {
    let meta = meta();
    let mut h = Headers::new(Bth::new(Opcode::RcWriteOnlyImm, 3, 4));
    h.reth = Some(Reth { va: 0x1000, rkey: 7, dma_len: 5 });
    h.imm = Some(0xdead_beef);
    for n in 0..32 {
        let mut buf = vec![0; n];
        assert_eq!(emit_headers(&h, 5, &mut buf), Err(PacketError::BufferTooSmall { need: 32, have: n }));
    }
    let mut frame = vec![0; frame_len(&h, 5)];
    assert_eq!(emit_headers(&h, 5, &mut frame), Ok(32));
    // seal refuses frames too short for the headers + pad + ICRC, or of the wrong length.
    for n in 0..32 + 3 + ICRC_LEN {
        let mut short = frame[..n].to_vec();
        assert!(matches!(seal(&meta, &mut short), Err(PacketError::BufferTooSmall { .. })), "{n}");
    }
    let mut long = frame.clone();
    long.push(0);
    assert_eq!(seal(&meta, &mut long), Err(PacketError::BadPad { pad: 3, payload_len: 6 }));
    let mut garbage = vec![0xff; 40];
    assert_eq!(seal(&meta, &mut garbage), Err(PacketError::UnknownOpcode(0xff)));
    seal(&meta, &mut frame).unwrap();
    assert_eq!(parse(&meta, &frame).unwrap().payload, &[0; 5]);
}

// ----- decoding errors -----

#[test]
fn truncated_frames() {
    let meta = meta();
    let mut rng = Rng(0x7e57);
    for op in ALL_OPCODES {
        for len in [0usize, 1, 2, 3, 4, 64] {
            if op == Opcode::RcAck && len != 0 {
                continue;
            }
            let h = random_headers(op, &mut rng);
            let payload = rng.bytes(len);
            let frame = built(&meta, &h, &payload);
            let need = h.len() + pad_len(len) + ICRC_LEN;
            for n in 0..frame.len() {
                let cut = &frame[..n];
                let (a, b) = (parse(&meta, cut), parse_unchecked(cut));
                if n < BTH_LEN + ICRC_LEN {
                    let want = Err(PacketError::Truncated { need: BTH_LEN + ICRC_LEN, have: n });
                    assert_eq!(a, want, "{op:?} {len} {n}");
                    assert_eq!(b, want, "{op:?} {len} {n}");
                } else if n < need {
                    let want = Err(PacketError::Truncated { need, have: n });
                    assert_eq!(a, want, "{op:?} {len} {n}");
                    assert_eq!(b, want, "{op:?} {len} {n}");
                } else {
                    // Structurally a shorter packet: misaligned, or caught by the ICRC.
                    assert!(
                        matches!(a, Err(PacketError::BadPad { .. } | PacketError::BadIcrc { .. })),
                        "{a:?}"
                    );
                    match b {
                        Ok(p) => assert_eq!(p.payload.len() + pad_len(len) + need, n),
                        Err(e) => assert!(matches!(e, PacketError::BadPad { .. }), "{e}"),
                    }
                }
            }
        }
    }
}

#[test]
fn specific_decode_errors() {
    let meta = meta();
    let h = Headers::new(Bth::new(Opcode::RcSendOnly, 1, 2));
    let good = built(&meta, &h, b"abcd");

    let mut f = good.clone();
    f[1] |= 0x03;
    assert_eq!(parse_unchecked(&f), Err(PacketError::BadTransportVersion(3)));
    f = good.clone();
    f[0] = 0x0c;
    assert_eq!(parse_unchecked(&f), Err(PacketError::UnsupportedOpcode(0x0c)));
    f = good.clone();
    f[0] = 0x15;
    assert_eq!(parse_unchecked(&f), Err(PacketError::UnknownOpcode(0x15)));
    // A 5-byte payload area with pad count 1: misaligned.
    f = built(&meta, &h, b"abc");
    f.insert(BTH_LEN, 0);
    assert_eq!(parse_unchecked(&f), Err(PacketError::BadPad { pad: 1, payload_len: 4 }));
    // Reserved bits are ignored (but covered by the ICRC, except in byte 4).
    f = good.clone();
    f[8] |= 0x3f;
    assert_eq!(parse_unchecked(&f).unwrap().headers, h);
    assert!(matches!(parse(&meta, &f), Err(PacketError::BadIcrc { .. })));
    // The PAETH flag on a frame too short to hold one; on an opcode that may not carry
    // one; and with a NAK syndrome in it.
    f = good.clone();
    f[8] |= 0x40;
    assert_eq!(parse_unchecked(&f), Err(PacketError::Truncated { need: 24, have: 20 }));
    let long = built(&meta, &h, b"abcdefghijklmnopqrst");
    let mut ud = long.clone();
    ud[8] |= 0x40;
    ud[0] = Opcode::UdSendOnly.as_u8();
    assert_eq!(parse_unchecked(&ud), Err(PacketError::UnexpectedHeader("PAETH")));
    let mut nak = long.clone();
    nak[8] |= 0x40;
    nak[BTH_LEN + 4] = Syndrome::Nak(NakCode::RemoteAccessError).to_u8();
    assert_eq!(parse_unchecked(&nak), Err(PacketError::BadSyndrome(0x62)));
    f = good.clone();
    f[4] |= 0x3f;
    assert_eq!(parse(&meta, &f).unwrap().headers, h);

    // An ACK with a bad syndrome, and an ACK with a payload.
    let mut ack = Headers::new(Bth::new(Opcode::RcAck, 1, 2));
    ack.aeth = Some(Aeth { syndrome: Syndrome::Nak(NakCode::PsnSequenceError), msn: 3 });
    let good_ack = built(&meta, &ack, &[]);
    f = good_ack.clone();
    f[BTH_LEN] = 0x45;
    assert_eq!(parse_unchecked(&f), Err(PacketError::BadSyndrome(0x45)));
    f = good_ack[..BTH_LEN + AETH_LEN].to_vec();
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&[0; ICRC_LEN]);
    assert_eq!(
        parse_unchecked(&f),
        Err(PacketError::FieldOutOfRange { field: "ACK payload length", value: 4 })
    );

    // Errors render as text.
    assert_eq!(
        PacketError::BadIcrc { expected: 1, found: 2 }.to_string(),
        "bad ICRC: computed 0x00000001, frame has 0x00000002"
    );
    assert_eq!(PacketError::UnknownOpcode(0x15).to_string(), "unknown BTH opcode 0x15");
}

#[test]
fn every_single_bit_flip_is_caught() {
    let meta = meta();
    let mut rng = Rng(0xb17f_11b5);
    for op in ALL_OPCODES {
        let h = random_headers(op, &mut rng);
        let len = if op == Opcode::RcAck { 0 } else { 13 };
        let payload = rng.bytes(len);
        let frame = built(&meta, &h, &payload);
        for bit in 0..frame.len() * 8 {
            let mut f = frame.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            let r = parse(&meta, &f);
            if bit / 8 == 4 {
                // FECN/BECN/reserved: outside the ICRC by design.
                let p = r.unwrap();
                let mut want = with_pad(&h, len);
                want.bth.fecn = f[4] & 0x80 != 0;
                want.bth.becn = f[4] & 0x40 != 0;
                assert_eq!(p.headers, want);
            } else {
                assert!(r.is_err(), "{op:?}: flip of bit {bit} not detected");
            }
        }
    }
}

// ----- fuzz -----

#[test]
fn fuzz_never_panics_and_catches_bit_flips() {
    const SEED: u64 = 0x5eed_0ff0_dd1e_5500;
    const ROUNDS: usize = 100_000;
    let mut rng = Rng(SEED);
    let meta = meta();
    let mut parsed = 0usize;
    for round in 0..ROUNDS {
        let frame = match round % 4 {
            // Random bytes, random length.
            0 => {
                let n = rng.below(96) as usize;
                rng.bytes(n)
            }
            // Random bytes behind a plausible first word (valid opcode, TVer 0).
            1 => {
                let n = BTH_LEN + rng.below(80) as usize;
                let mut f = rng.bytes(n);
                f[0] = ALL_OPCODES[rng.below(ALL_OPCODES.len() as u64) as usize].as_u8();
                f[1] &= 0xf0;
                f
            }
            // A valid frame with one bit flipped (may be the ECN byte, see below).
            _ => {
                let op = ALL_OPCODES[rng.below(ALL_OPCODES.len() as u64) as usize];
                let h = random_headers(op, &mut rng);
                let len = if op == Opcode::RcAck { 0 } else { rng.below(300) as usize };
                let payload = rng.bytes(len);
                let mut f = built(&meta, &h, &payload);
                let valid = f.clone();
                let bit = rng.below(f.len() as u64 * 8) as usize;
                f[bit / 8] ^= 1 << (bit % 8);
                let r = parse(&meta, &f);
                if bit / 8 == 4 {
                    assert!(r.is_ok(), "seed {SEED:#x} round {round}: ECN flip refused: {r:?}");
                } else {
                    assert!(
                        r.is_err(),
                        "seed {SEED:#x} round {round}: flip of bit {bit} in {op:?} frame {valid:02x?} not caught"
                    );
                }
                f
            }
        };
        let checked = parse(&meta, &frame);
        let unchecked = parse_unchecked(&frame);
        if let Ok(p) = unchecked {
            parsed += 1;
            // Invariants of anything that parses.
            assert_eq!(p.headers.validate(), Ok(()), "seed {SEED:#x} round {round}");
            let pad = usize::from(p.headers.bth.pad_count);
            assert_eq!(
                p.headers.len() + p.payload.len() + pad + ICRC_LEN,
                frame.len(),
                "seed {SEED:#x} round {round}"
            );
            assert_eq!(frame_len(&p.headers, p.payload.len()), frame.len(), "seed {SEED:#x} round {round}");
            // Re-encoding gives the same bytes up to reserved bits, pad contents and ICRC.
            let mut again = Vec::new();
            build(&meta, &p.headers, p.payload, &mut again).unwrap();
            assert_eq!(parse_unchecked(&again), Ok(p), "seed {SEED:#x} round {round}");
        } else {
            assert!(checked.is_err(), "seed {SEED:#x} round {round}");
        }
        if let Ok(p) = checked {
            assert_eq!(Ok(p), unchecked, "seed {SEED:#x} round {round}");
        }
    }
    assert!(parsed > ROUNDS / 10, "seed {SEED:#x}: only {parsed} frames parsed; the fuzzer is too shallow");
}

// ----- PSN arithmetic and timers -----

#[test]
fn psn_arithmetic_wraps() {
    assert_eq!(psn_add(PSN_MASK, 1), 0);
    assert_eq!(psn_add(PSN_MASK - 1, 5), 3);
    assert_eq!(psn_add(5, PSN_MASK + 1), 5);
    assert_eq!(psn_add(0, u32::MAX), PSN_MASK);
    assert_eq!(psn_diff(0, PSN_MASK), 1);
    assert_eq!(psn_diff(PSN_MASK, 0), -1);
    assert_eq!(psn_diff(7, 7), 0);
    assert_eq!(psn_diff(0x7f_ffff, 0), 0x7f_ffff);
    assert_eq!(psn_diff(0x80_0000, 0), -0x80_0000);
    assert_eq!(psn_diff(0, 0x80_0000), -0x80_0000);
    assert_eq!(psn_diff(0, 0x80_0001), 0x7f_ffff);
    assert!(psn_lt(PSN_MASK, 0));
    assert!(!psn_lt(0, PSN_MASK));
    assert!(!psn_lt(3, 3));
    assert!(psn_lt(0xff_fff0, 0x10));
    // Garbage above bit 23 does not matter.
    assert_eq!(psn_diff(0xff00_0001, 0x0000_0000), 1);
    let mut rng = Rng(0x95e);
    for _ in 0..10_000 {
        let a = rng.u24();
        let n = rng.u32() & 0x7f_ffff;
        let b = psn_add(a, n);
        assert!(b <= PSN_MASK);
        assert_eq!(psn_diff(b, a), n as i32, "a {a:#x} n {n:#x}");
        assert_eq!(psn_diff(a, b), -(n as i32), "a {a:#x} n {n:#x}");
        assert_eq!(psn_lt(a, b), n != 0);
    }
}

#[test]
fn timer_codes() {
    assert_eq!(rnr_timer_duration(0), Duration::from_micros(655_360));
    assert_eq!(rnr_timer_duration(1), Duration::from_micros(10));
    assert_eq!(rnr_timer_duration(14), Duration::from_micros(1_280));
    assert_eq!(rnr_timer_duration(18), Duration::from_micros(5_120));
    assert_eq!(rnr_timer_duration(31), Duration::from_micros(491_520));
    assert_eq!(rnr_timer_duration(255), Duration::from_micros(491_520));
    for c in 2..=31u8 {
        assert!(rnr_timer_duration(c) > rnr_timer_duration(c - 1), "{c}");
    }
    assert_eq!(ack_timeout_duration(0), None);
    assert_eq!(ack_timeout_duration(1), Some(Duration::from_nanos(8_192)));
    assert_eq!(ack_timeout_duration(14), Some(Duration::from_nanos(67_108_864)));
    assert_eq!(ack_timeout_duration(31), Some(Duration::from_nanos(4_096 << 31)));
    assert_eq!(ack_timeout_duration(40), ack_timeout_duration(31));
}

#[test]
fn gsi_mad_frame() {
    // A CM MAD: UD SEND ONLY to QP1, Q_Key 0x80010000, source QP 1, 256-byte payload.
    let meta = meta();
    let mut h = Headers::new(Bth::new(Opcode::UdSendOnly, 1, 0));
    h.deth = Some(Deth { qkey: GSI_QKEY, src_qp: 1 });
    let mad = [0x11u8; 256];
    let frame = built(&meta, &h, &mad);
    assert_eq!(frame.len(), 280);
    assert_eq!(&frame[..20], &hex("6400ffff000000010000000080010000 00000001".replace(' ', "").as_str())[..]);
    assert_eq!(parse(&meta, &frame).unwrap().headers, h);
}
