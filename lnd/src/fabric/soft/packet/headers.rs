//! The transport headers (BTH, RETH, DETH, AETH with its syndromes and NAK codes, the
//! piggybacked ACK) and [`Headers`], one packet's stack of them: each read from and written
//! to its bit-exact layout.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use super::{
    AETH_LEN, BTH_LEN, DEFAULT_PKEY, DETH_LEN, IMM_LEN, Opcode, PAETH_LEN, PacketError, RETH_LEN, U24_MAX,
    in_range, presence,
};

/// The Base Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    /// Operation.
    pub opcode: Opcode,
    /// Solicited event (SE): the responder raises a solicited completion event.
    pub solicited: bool,
    /// Migration request (MigReq); unused by the software device, carried as is.
    pub mig_req: bool,
    /// Number of pad bytes after the payload (0..=3). [`emit_headers`](super::emit_headers) computes it.
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

    pub(super) fn encode(&self) -> [u8; BTH_LEN] {
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

    pub(super) fn decode(b: [u8; BTH_LEN]) -> Result<Bth, PacketError> {
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
    pub(super) fn encode(&self) -> [u8; RETH_LEN] {
        let [v0, v1, v2, v3, v4, v5, v6, v7] = self.va.to_be_bytes();
        let [r0, r1, r2, r3] = self.rkey.to_be_bytes();
        let [l0, l1, l2, l3] = self.dma_len.to_be_bytes();
        [v0, v1, v2, v3, v4, v5, v6, v7, r0, r1, r2, r3, l0, l1, l2, l3]
    }

    pub(super) fn decode(b: [u8; RETH_LEN]) -> Reth {
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
    /// Queue key the receiving UD QP checks ([`GSI_QKEY`](super::GSI_QKEY) for QP1).
    pub qkey: u32,
    /// The sending QP number (24 bits).
    pub src_qp: u32,
}

impl Deth {
    pub(super) fn encode(&self) -> [u8; DETH_LEN] {
        let [k0, k1, k2, k3] = self.qkey.to_be_bytes();
        let [_, s0, s1, s2] = self.src_qp.to_be_bytes();
        [k0, k1, k2, k3, 0, s0, s1, s2]
    }

    pub(super) fn decode(b: [u8; DETH_LEN]) -> Deth {
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

    pub(super) const fn from_code(c: u8) -> Option<NakCode> {
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
    /// `001ttttt`: receiver not ready; retry after [`rnr_timer_duration`](super::rnr_timer_duration)`(timer)`.
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
    pub(super) fn encode(&self) -> [u8; AETH_LEN] {
        let [_, m0, m1, m2] = self.msn.to_be_bytes();
        [self.syndrome.to_u8(), m0, m1, m2]
    }

    pub(super) fn decode(b: [u8; AETH_LEN]) -> Result<Aeth, PacketError> {
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
    pub(super) fn encode(&self) -> [u8; PAETH_LEN] {
        let [_, p0, p1, p2] = self.psn.to_be_bytes();
        let [_, m0, m1, m2] = self.msn.to_be_bytes();
        [0, p0, p1, p2, Syndrome::Ack { credit_code: NO_CREDIT_CODE }.to_u8(), m0, m1, m2]
    }

    pub(super) fn decode(b: [u8; PAETH_LEN]) -> Result<PiggyAck, PacketError> {
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
