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
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::net::Ipv4Addr;
use std::time::Duration;

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

/// The BTH opcodes the software device speaks. The discriminant is the wire value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RC SEND FIRST: first packet of a multi-packet SEND.
    RcSendFirst = 0x00,
    /// RC SEND MIDDLE.
    RcSendMiddle = 0x01,
    /// RC SEND LAST.
    RcSendLast = 0x02,
    /// RC SEND LAST with immediate data.
    RcSendLastImm = 0x03,
    /// RC SEND ONLY: a single-packet SEND.
    RcSendOnly = 0x04,
    /// RC SEND ONLY with immediate data.
    RcSendOnlyImm = 0x05,
    /// RC RDMA WRITE FIRST (carries the RETH).
    RcWriteFirst = 0x06,
    /// RC RDMA WRITE MIDDLE.
    RcWriteMiddle = 0x07,
    /// RC RDMA WRITE LAST.
    RcWriteLast = 0x08,
    /// RC RDMA WRITE LAST with immediate data.
    RcWriteLastImm = 0x09,
    /// RC RDMA WRITE ONLY (carries the RETH).
    RcWriteOnly = 0x0a,
    /// RC RDMA WRITE ONLY with immediate data (RETH + ImmDt).
    RcWriteOnlyImm = 0x0b,
    /// RC ACKNOWLEDGE (AETH, no payload): ACK, RNR NAK or NAK.
    RcAck = 0x11,
    /// UD SEND ONLY (DETH): management datagrams to and from QP1.
    UdSendOnly = 0x64,
    /// UD SEND ONLY with immediate data (DETH + ImmDt).
    UdSendOnlyImm = 0x65,
    /// Vendor (manufacturer-specific range): an RC RDMA WRITE the responder places itself on
    /// the same host. RETH + a payload naming the requester's gather list
    /// (`super::place::PlacedWrite`); it takes the PSNs the WRITE would take on the wire.
    RcPlacedWrite = 0xf0,
    /// Vendor: [`Opcode::RcPlacedWrite`] with immediate data (RETH + ImmDt).
    RcPlacedWriteImm = 0xf1,
}

impl Opcode {
    /// Decodes a BTH opcode byte. Opcodes IBTA defines that the software device does not
    /// implement (RDMA READ, atomics, SEND with invalidate, FLUSH, ATOMIC WRITE, all of UC, RD
    /// and XRC, CNP 0x81) give [`PacketError::UnsupportedOpcode`]; reserved and
    /// manufacturer-specific values give [`PacketError::UnknownOpcode`].
    pub fn from_u8(b: u8) -> Result<Opcode, PacketError> {
        Ok(match b {
            0x00 => Opcode::RcSendFirst,
            0x01 => Opcode::RcSendMiddle,
            0x02 => Opcode::RcSendLast,
            0x03 => Opcode::RcSendLastImm,
            0x04 => Opcode::RcSendOnly,
            0x05 => Opcode::RcSendOnlyImm,
            0x06 => Opcode::RcWriteFirst,
            0x07 => Opcode::RcWriteMiddle,
            0x08 => Opcode::RcWriteLast,
            0x09 => Opcode::RcWriteLastImm,
            0x0a => Opcode::RcWriteOnly,
            0x0b => Opcode::RcWriteOnlyImm,
            0x11 => Opcode::RcAck,
            0x64 => Opcode::UdSendOnly,
            0x65 => Opcode::UdSendOnlyImm,
            0xf0 => Opcode::RcPlacedWrite,
            0xf1 => Opcode::RcPlacedWriteImm,
            _ if is_known_ibta_opcode(b) => return Err(PacketError::UnsupportedOpcode(b)),
            _ => return Err(PacketError::UnknownOpcode(b)),
        })
    }

    /// The wire value.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Whether packets with this opcode carry a RETH (WRITE FIRST / ONLY / ONLY+IMM).
    pub const fn has_reth(self) -> bool {
        matches!(
            self,
            Opcode::RcWriteFirst
                | Opcode::RcWriteOnly
                | Opcode::RcWriteOnlyImm
                | Opcode::RcPlacedWrite
                | Opcode::RcPlacedWriteImm
        )
    }

    /// Whether packets with this opcode carry immediate data.
    pub const fn has_imm(self) -> bool {
        matches!(
            self,
            Opcode::RcSendLastImm
                | Opcode::RcSendOnlyImm
                | Opcode::RcWriteLastImm
                | Opcode::RcWriteOnlyImm
                | Opcode::UdSendOnlyImm
                | Opcode::RcPlacedWriteImm
        )
    }

    /// Whether packets with this opcode carry an AETH (the ACK).
    pub const fn has_aeth(self) -> bool {
        matches!(self, Opcode::RcAck)
    }

    /// Whether packets with this opcode carry a DETH (the UD opcodes).
    pub const fn has_deth(self) -> bool {
        matches!(self, Opcode::UdSendOnly | Opcode::UdSendOnlyImm)
    }

    /// Whether this is one of the RC SEND opcodes (0x00..=0x05).
    pub const fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::RcSendFirst
                | Opcode::RcSendMiddle
                | Opcode::RcSendLast
                | Opcode::RcSendLastImm
                | Opcode::RcSendOnly
                | Opcode::RcSendOnlyImm
        )
    }

    /// Whether this is one of the RC RDMA WRITE opcodes (0x06..=0x0b).
    pub const fn is_write(self) -> bool {
        matches!(
            self,
            Opcode::RcWriteFirst
                | Opcode::RcWriteMiddle
                | Opcode::RcWriteLast
                | Opcode::RcWriteLastImm
                | Opcode::RcWriteOnly
                | Opcode::RcWriteOnlyImm
        )
    }

    /// Whether a packet with this opcode starts a message (a FIRST or an ONLY, UD included).
    pub const fn is_first(self) -> bool {
        matches!(
            self,
            Opcode::RcSendFirst
                | Opcode::RcSendOnly
                | Opcode::RcSendOnlyImm
                | Opcode::RcWriteFirst
                | Opcode::RcWriteOnly
                | Opcode::RcWriteOnlyImm
                | Opcode::UdSendOnly
                | Opcode::UdSendOnlyImm
                | Opcode::RcPlacedWrite
                | Opcode::RcPlacedWriteImm
        )
    }

    /// Whether a packet with this opcode ends a message (a LAST or an ONLY, UD included).
    pub const fn is_last(self) -> bool {
        matches!(
            self,
            Opcode::RcSendLast
                | Opcode::RcSendLastImm
                | Opcode::RcSendOnly
                | Opcode::RcSendOnlyImm
                | Opcode::RcWriteLast
                | Opcode::RcWriteLastImm
                | Opcode::RcWriteOnly
                | Opcode::RcWriteOnlyImm
                | Opcode::UdSendOnly
                | Opcode::UdSendOnlyImm
                | Opcode::RcPlacedWrite
                | Opcode::RcPlacedWriteImm
        )
    }

    /// Whether this is an RC request opcode (SEND, RDMA WRITE or placed WRITE): the packets a
    /// [`PiggyAck`] may ride on.
    pub const fn is_rc_request(self) -> bool {
        self.is_send() || self.is_write() || self.is_placed()
    }

    /// A vendor placed WRITE ([`Opcode::RcPlacedWrite`], [`Opcode::RcPlacedWriteImm`]).
    pub const fn is_placed(self) -> bool {
        matches!(self, Opcode::RcPlacedWrite | Opcode::RcPlacedWriteImm)
    }

    /// The length of the BTH plus the extension headers this opcode carries.
    pub const fn header_len(self) -> usize {
        BTH_LEN
            + if self.has_deth() { DETH_LEN } else { 0 }
            + if self.has_reth() { RETH_LEN } else { 0 }
            + if self.has_aeth() { AETH_LEN } else { 0 }
            + if self.has_imm() { IMM_LEN } else { 0 }
    }
}

/// Whether IBTA (vol. 1 table 38 and the RoCEv2/XRC annexes) defines opcode `b`.
const fn is_known_ibta_opcode(b: u8) -> bool {
    let op = b & 0x1f;
    match b >> 5 {
        // RC: SEND, WRITE, READ, ACK, atomics, SEND with invalidate, FLUSH, ATOMIC WRITE.
        0 => op <= 0x14 || op == 0x16 || op == 0x17 || op == 0x1c || op == 0x1d,
        // UC: SEND and WRITE only.
        1 => op <= 0x0b,
        // RD: as RC without invalidate, plus RESYNC (0x55).
        2 => op <= 0x15 || op == 0x1c || op == 0x1d,
        // UD: SEND ONLY (+IMM).
        3 => op == 0x04 || op == 0x05,
        // CNP (RoCEv2 congestion notification, 0x81).
        4 => op == 0x01,
        // XRC: as RC.
        5 => op <= 0x14 || op == 0x16 || op == 0x17,
        // 0xC0..=0xFF: reserved and manufacturer-specific.
        _ => false,
    }
}

/// The Base Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    /// Operation.
    pub opcode: Opcode,
    /// Solicited event (SE): the responder raises a solicited completion event.
    pub solicited: bool,
    /// Migration request (MigReq); unused by the software device, carried as is.
    pub mig_req: bool,
    /// Number of pad bytes after the payload (0..=3). [`emit_headers`] computes it.
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification. Not covered by the ICRC.
    pub fecn: bool,
    /// Backward explicit congestion notification. Not covered by the ICRC.
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request: the responder should ACK this packet.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// A BTH for `opcode` to `dest_qp` at `psn`: P_Key [`DEFAULT_PKEY`], every flag clear,
    /// pad count 0. Out-of-range QPNs and PSNs are not masked; [`Headers::validate`] refuses
    /// them.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    fn encode(&self) -> [u8; BTH_LEN] {
        let [pk0, pk1] = self.pkey.to_be_bytes();
        let [_, q0, q1, q2] = self.dest_qp.to_be_bytes();
        let [_, p0, p1, p2] = self.psn.to_be_bytes();
        [
            self.opcode.as_u8(),
            (u8::from(self.solicited) << 7) | (u8::from(self.mig_req) << 6) | ((self.pad_count & 3) << 4),
            pk0,
            pk1,
            (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6),
            q0,
            q1,
            q2,
            u8::from(self.ack_req) << 7,
            p0,
            p1,
            p2,
        ]
    }

    fn decode(b: [u8; BTH_LEN]) -> Result<Bth, PacketError> {
        let [op, b1, pk0, pk1, b4, q0, q1, q2, b8, p0, p1, p2] = b;
        let opcode = Opcode::from_u8(op)?;
        let tver = b1 & 0x0f;
        if tver != 0 {
            return Err(PacketError::BadTransportVersion(tver));
        }
        Ok(Bth {
            opcode,
            solicited: b1 & 0x80 != 0,
            mig_req: b1 & 0x40 != 0,
            pad_count: (b1 >> 4) & 3,
            pkey: u16::from_be_bytes([pk0, pk1]),
            fecn: b4 & 0x80 != 0,
            becn: b4 & 0x40 != 0,
            dest_qp: u32::from_be_bytes([0, q0, q1, q2]),
            ack_req: b8 & 0x80 != 0,
            psn: u32::from_be_bytes([0, p0, p1, p2]),
        })
    }
}

/// The RDMA Extended Transport Header: where an RDMA WRITE lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth {
    /// Remote virtual address of the first byte.
    pub va: u64,
    /// Remote key of the target region.
    pub rkey: u32,
    /// Length of the whole WRITE message in bytes (not just this packet).
    pub dma_len: u32,
}

impl Reth {
    fn encode(&self) -> [u8; RETH_LEN] {
        let [v0, v1, v2, v3, v4, v5, v6, v7] = self.va.to_be_bytes();
        let [r0, r1, r2, r3] = self.rkey.to_be_bytes();
        let [l0, l1, l2, l3] = self.dma_len.to_be_bytes();
        [v0, v1, v2, v3, v4, v5, v6, v7, r0, r1, r2, r3, l0, l1, l2, l3]
    }

    fn decode(b: [u8; RETH_LEN]) -> Reth {
        let [v0, v1, v2, v3, v4, v5, v6, v7, r0, r1, r2, r3, l0, l1, l2, l3] = b;
        Reth {
            va: u64::from_be_bytes([v0, v1, v2, v3, v4, v5, v6, v7]),
            rkey: u32::from_be_bytes([r0, r1, r2, r3]),
            dma_len: u32::from_be_bytes([l0, l1, l2, l3]),
        }
    }
}

/// The Datagram Extended Transport Header of UD packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deth {
    /// Queue key the receiving UD QP checks ([`GSI_QKEY`] for QP1).
    pub qkey: u32,
    /// The sending QP number (24 bits).
    pub src_qp: u32,
}

impl Deth {
    fn encode(&self) -> [u8; DETH_LEN] {
        let [k0, k1, k2, k3] = self.qkey.to_be_bytes();
        let [_, s0, s1, s2] = self.src_qp.to_be_bytes();
        [k0, k1, k2, k3, 0, s0, s1, s2]
    }

    fn decode(b: [u8; DETH_LEN]) -> Deth {
        let [k0, k1, k2, k3, _reserved, s0, s1, s2] = b;
        Deth { qkey: u32::from_be_bytes([k0, k1, k2, k3]), src_qp: u32::from_be_bytes([0, s0, s1, s2]) }
    }
}

/// The error a NAK reports (AETH syndrome `011ccccc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NakCode {
    /// 0: a request packet arrived out of sequence; the requester goes back to the NAK's PSN.
    PsnSequenceError,
    /// 1: the request was malformed or not allowed on this QP.
    InvalidRequest,
    /// 2: R_Key, address range or access rights check failed.
    RemoteAccessError,
    /// 3: the responder could not complete the request (internal error).
    RemoteOperationalError,
    /// 4: invalid RD request (RD only; never sent on RC).
    InvalidRdRequest,
    /// Vendor code 31 (reserved by IBTA): the responder cannot place this same-host WRITE
    /// (`super::place`); the requester sends it again from this PSN on the wire, without
    /// spending a retry, and stops placing to this peer.
    PlacementRefused,
}

impl NakCode {
    const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::PlacementRefused => 31,
        }
    }

    const fn from_code(c: u8) -> Option<NakCode> {
        match c {
            0 => Some(NakCode::PsnSequenceError),
            1 => Some(NakCode::InvalidRequest),
            2 => Some(NakCode::RemoteAccessError),
            3 => Some(NakCode::RemoteOperationalError),
            4 => Some(NakCode::InvalidRdRequest),
            31 => Some(NakCode::PlacementRefused),
            _ => None,
        }
    }
}

/// The AETH syndrome: what kind of acknowledgement this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    /// `000ccccc`: positive ACK. `credit_code` (0..=31) is the encoded end-to-end credit
    /// count; 31 (0x1F) means "no credit information" (what rxe and the software device send).
    Ack {
        /// Encoded credit count (5 bits).
        credit_code: u8,
    },
    /// `001ttttt`: receiver not ready; retry after [`rnr_timer_duration`]`(timer)`.
    RnrNak {
        /// RNR timer code (5 bits).
        timer: u8,
    },
    /// `011ccccc`: negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// The syndrome byte. The 5-bit credit code or timer is masked to its field; use
    /// [`Headers::validate`] to refuse out-of-range values instead.
    pub fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => credit_code & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.code(),
        }
    }

    /// Decodes a syndrome byte: bit 7 set, type `10` (reserved) and undefined NAK codes give
    /// [`PacketError::BadSyndrome`].
    pub fn from_u8(b: u8) -> Result<Syndrome, PacketError> {
        let low = b & 0x1f;
        match b >> 5 {
            0 => Ok(Syndrome::Ack { credit_code: low }),
            1 => Ok(Syndrome::RnrNak { timer: low }),
            3 => NakCode::from_code(low).map(Syndrome::Nak).ok_or(PacketError::BadSyndrome(b)),
            _ => Err(PacketError::BadSyndrome(b)),
        }
    }
}

/// The ACK Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number: inbound messages completed, modulo 2^24.
    pub msn: u32,
}

impl Aeth {
    fn encode(&self) -> [u8; AETH_LEN] {
        let [_, m0, m1, m2] = self.msn.to_be_bytes();
        [self.syndrome.to_u8(), m0, m1, m2]
    }

    fn decode(b: [u8; AETH_LEN]) -> Result<Aeth, PacketError> {
        let [s, m0, m1, m2] = b;
        Ok(Aeth { syndrome: Syndrome::from_u8(s)?, msn: u32::from_be_bytes([0, m0, m1, m2]) })
    }
}

/// A positive ACK riding on an RC request packet of the other direction (the PAETH).
///
/// An RC connection carries requests both ways, so the responder of one direction usually has
/// a request of its own to send soon after it accepted one (the reply to a ping, the PUT_ACK
/// to a PUT_REQ). Instead of a separate ACK frame, the software device puts the ACK it owes
/// into that request's PAETH: `[reserved 8 | PSN 24 | syndrome 8 (ACK, no credit info) | MSN 24]`.
/// It means exactly what an RC ACK with that PSN and MSN means. Only positive ACKs ride: NAKs
/// and RNR NAKs always go as ACK frames of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PiggyAck {
    /// The last PSN acknowledged (24 bits).
    pub psn: u32,
    /// Message sequence number of the acknowledging responder (24 bits).
    pub msn: u32,
}

impl PiggyAck {
    fn encode(&self) -> [u8; PAETH_LEN] {
        let [_, p0, p1, p2] = self.psn.to_be_bytes();
        let [_, m0, m1, m2] = self.msn.to_be_bytes();
        [0, p0, p1, p2, Syndrome::Ack { credit_code: NO_CREDIT_CODE }.to_u8(), m0, m1, m2]
    }

    fn decode(b: [u8; PAETH_LEN]) -> Result<PiggyAck, PacketError> {
        let [_reserved, p0, p1, p2, s, m0, m1, m2] = b;
        match Syndrome::from_u8(s)? {
            Syndrome::Ack { .. } => {}
            _ => return Err(PacketError::BadSyndrome(s)),
        }
        Ok(PiggyAck { psn: u32::from_be_bytes([0, p0, p1, p2]), msn: u32::from_be_bytes([0, m0, m1, m2]) })
    }
}

/// The AETH credit code meaning "no credit information".
const NO_CREDIT_CODE: u8 = 0x1f;

/// All the headers of one packet: the BTH and the extension headers its opcode carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    /// Base Transport Header.
    pub bth: Bth,
    /// Piggybacked ACK (RC request opcodes only; the software device's own header).
    pub piggy: Option<PiggyAck>,
    /// Datagram ETH (UD opcodes).
    pub deth: Option<Deth>,
    /// RDMA ETH (WRITE FIRST / ONLY / ONLY+IMM).
    pub reth: Option<Reth>,
    /// ACK ETH (ACK).
    pub aeth: Option<Aeth>,
    /// Immediate data (the `*Imm` opcodes), as the big-endian u32 on the wire.
    pub imm: Option<u32>,
}

impl Headers {
    /// Just a BTH, no extension headers (fill in the ones the opcode needs).
    pub fn new(bth: Bth) -> Headers {
        Headers { bth, piggy: None, deth: None, reth: None, aeth: None, imm: None }
    }

    /// The encoded length of the BTH and the extension headers present.
    #[allow(clippy::len_without_is_empty, reason = "a header stack is never empty")]
    pub fn len(&self) -> usize {
        BTH_LEN
            + self.piggy.map_or(0, |_| PAETH_LEN)
            + self.deth.map_or(0, |_| DETH_LEN)
            + self.reth.map_or(0, |_| RETH_LEN)
            + self.aeth.map_or(0, |_| AETH_LEN)
            + self.imm.map_or(0, |_| IMM_LEN)
    }

    /// Checks that exactly the extension headers the opcode carries are present and that
    /// every sub-byte field is in range (24-bit QPNs, PSN and MSN; 2-bit pad count; 5-bit
    /// credit code and RNR timer).
    pub fn validate(&self) -> Result<(), PacketError> {
        let op = self.bth.opcode;
        presence("DETH", op.has_deth(), self.deth.is_some())?;
        presence("RETH", op.has_reth(), self.reth.is_some())?;
        presence("AETH", op.has_aeth(), self.aeth.is_some())?;
        presence("ImmDt", op.has_imm(), self.imm.is_some())?;
        if let Some(p) = &self.piggy {
            if !op.is_rc_request() {
                return Err(PacketError::UnexpectedHeader("PAETH"));
            }
            in_range("PAETH psn", u64::from(p.psn), u64::from(U24_MAX))?;
            in_range("PAETH msn", u64::from(p.msn), u64::from(U24_MAX))?;
        }
        in_range("BTH dest_qp", u64::from(self.bth.dest_qp), u64::from(U24_MAX))?;
        in_range("BTH psn", u64::from(self.bth.psn), u64::from(U24_MAX))?;
        in_range("BTH pad_count", u64::from(self.bth.pad_count), 3)?;
        if let Some(deth) = &self.deth {
            in_range("DETH src_qp", u64::from(deth.src_qp), u64::from(U24_MAX))?;
        }
        if let Some(aeth) = &self.aeth {
            in_range("AETH msn", u64::from(aeth.msn), u64::from(U24_MAX))?;
            match aeth.syndrome {
                Syndrome::Ack { credit_code } => {
                    in_range("AETH credit code", u64::from(credit_code), 0x1f)?;
                }
                Syndrome::RnrNak { timer } => in_range("AETH RNR timer", u64::from(timer), 0x1f)?,
                Syndrome::Nak(_) => {}
            }
        }
        Ok(())
    }
}

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
mod tests {
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
        for b in [
            0x0c, 0x0d, 0x10, 0x12, 0x13, 0x14, 0x16, 0x17, 0x1c, 0x1d, 0x20, 0x2b, 0x40, 0x55, 0x81, 0xa0,
            0xb7,
        ] {
            assert_eq!(Opcode::from_u8(b), Err(PacketError::UnsupportedOpcode(b)), "{b:#x}");
        }
        for b in [
            0x15, 0x18, 0x1b, 0x1e, 0x2c, 0x3f, 0x60, 0x63, 0x66, 0x80, 0x82, 0xb5, 0xc0, 0xe0, 0xef, 0xf2,
            0xff,
        ] {
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
            assert!(
                matches!(err, PacketError::FieldOutOfRange { field: f, .. } if f == field),
                "{field}: {err}"
            );
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
                (
                    Headers { deth: if good.deth.is_some() { None } else { deth }, ..good },
                    "DETH",
                    op.has_deth(),
                ),
                (
                    Headers { reth: if good.reth.is_some() { None } else { reth }, ..good },
                    "RETH",
                    op.has_reth(),
                ),
                (
                    Headers { aeth: if good.aeth.is_some() { None } else { aeth }, ..good },
                    "AETH",
                    op.has_aeth(),
                ),
                (
                    Headers { imm: if good.imm.is_some() { None } else { Some(9) }, ..good },
                    "ImmDt",
                    op.has_imm(),
                ),
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
                assert_eq!(
                    frame_len(&p.headers, p.payload.len()),
                    frame.len(),
                    "seed {SEED:#x} round {round}"
                );
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
        assert!(
            parsed > ROUNDS / 10,
            "seed {SEED:#x}: only {parsed} frames parsed; the fuzzer is too shallow"
        );
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
        assert_eq!(
            &frame[..20],
            &hex("6400ffff000000010000000080010000 00000001".replace(' ', "").as_str())[..]
        );
        assert_eq!(parse(&meta, &frame).unwrap().headers, h);
    }
}
