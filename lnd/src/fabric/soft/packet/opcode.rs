//! The BTH opcodes the software device speaks (RC SEND, WRITE and ACK, UD SEND for the GSI,
//! and the vendor placement request), with what each carries.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use super::{AETH_LEN, BTH_LEN, DETH_LEN, IMM_LEN, PacketError, RETH_LEN};

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
    /// [`PiggyAck`](super::PiggyAck) may ride on.
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
