//! The CM messages other than the REQ: [`Rep`], [`Rtu`], [`Rej`], [`Mra`], [`Dreq`] and
//! [`Drep`], each with its bit-exact layout.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use super::{
    D, DREP_PRIVATE_DATA_LEN, DREQ_PRIVATE_DATA_LEN, FailoverAccepted, MRA_PRIVATE_DATA_LEN, MadError,
    MessageMraed, MessageRejected, REJ_ARI_LEN, REJ_PRIVATE_DATA_LEN, REP_PRIVATE_DATA_LEN,
    RTU_PRIVATE_DATA_LEN, Rd, RejReason, Wr, fit, fit8,
};

/// ConnectReply (attribute 0x0013).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    /// Local Comm ID (the replier's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the REQ's Local Comm ID).
    pub remote_comm_id: u32,
    /// Local Q_Key (0 for RC).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits; 0 unless RD).
    pub local_eecn: u32,
    /// Starting PSN (24 bits): where the REP's sender starts sending (IBTA; the REQ's sender
    /// expects it first; Linux reads it the other way round, see [`crate::cm::manager`]).
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay code (5 bits).
    pub target_ack_delay: u8,
    /// Whether the alternate path was accepted.
    pub failover_accepted: FailoverAccepted,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The replier's QP uses a shared receive queue.
    pub srq: bool,
    /// Local CA GUID (the replier's node GUID).
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl Default for Rep {
    /// All fields zero.
    fn default() -> Rep {
        Rep {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: 0,
            local_qpn: 0,
            local_eecn: 0,
            starting_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: FailoverAccepted::Accepted,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; REP_PRIVATE_DATA_LEN],
        }
    }
}

impl Rep {
    pub(super) fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let qpn = fit("local_qpn", self.local_qpn, 24)?;
        let eecn = fit("local_eecn", self.local_eecn, 24)?;
        let psn = fit("starting_psn", self.starting_psn, 24)?;
        let delay = fit8("target_ack_delay", self.target_ack_delay, 5)?;
        let rnr = fit8("rnr_retry_count", self.rnr_retry_count, 3)?;
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u32(D + 8, self.local_qkey);
        w.u32(D + 12, qpn << 8);
        w.u32(D + 16, eecn << 8);
        w.u32(D + 20, psn << 8);
        w.u8(D + 24, self.responder_resources);
        w.u8(D + 25, self.initiator_depth);
        w.u8(
            D + 26,
            (delay << 3) | (self.failover_accepted.code() << 1) | u8::from(self.end_to_end_flow_control),
        );
        w.u8(D + 27, (rnr << 5) | (u8::from(self.srq) << 4));
        w.u64(D + 28, self.local_ca_guid);
        w.bytes(D + 36, &self.private_data);
        Ok(())
    }

    pub(super) fn decode_from(r: &Rd<'_>) -> Result<Rep, MadError> {
        let fo = (r.u8(D + 26) >> 1) & 3;
        let failover_accepted =
            FailoverAccepted::from_code(fo).ok_or(MadError::InvalidFailoverAccepted(fo))?;
        Ok(Rep {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            local_qkey: r.u32(D + 8),
            local_qpn: r.u32(D + 12) >> 8,
            local_eecn: r.u32(D + 16) >> 8,
            starting_psn: r.u32(D + 20) >> 8,
            responder_resources: r.u8(D + 24),
            initiator_depth: r.u8(D + 25),
            target_ack_delay: r.u8(D + 26) >> 3,
            failover_accepted,
            end_to_end_flow_control: r.u8(D + 26) & 1 == 1,
            rnr_retry_count: r.u8(D + 27) >> 5,
            srq: (r.u8(D + 27) >> 4) & 1 == 1,
            local_ca_guid: r.u64(D + 28),
            private_data: r.array(D + 36),
        })
    }
}

/// ReadyToUse (attribute 0x0014).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtu {
    /// Local Comm ID (the REQ sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the REP's Local Comm ID).
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

impl Default for Rtu {
    /// All fields zero.
    fn default() -> Rtu {
        Rtu { local_comm_id: 0, remote_comm_id: 0, private_data: [0; RTU_PRIVATE_DATA_LEN] }
    }
}

impl Rtu {
    pub(super) fn encode_into(&self, w: &mut Wr<'_>) {
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.bytes(D + 8, &self.private_data);
    }

    pub(super) fn decode_from(r: &Rd<'_>) -> Rtu {
        Rtu { local_comm_id: r.u32(D), remote_comm_id: r.u32(D + 4), private_data: r.array(D + 8) }
    }
}

/// ConnectReject (attribute 0x0012).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// Local Comm ID (the rejecter's; 0 when Linux rejects a REQ).
    pub local_comm_id: u32,
    /// Remote Comm ID (the rejected message's Local Comm ID).
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MessageRejected,
    /// How many ARI bytes are meaningful (0..=72).
    pub reject_info_length: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional reject information.
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data (consumer data only with [`RejReason::ConsumerDefined`]).
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl Default for Rej {
    /// All fields zero except the reason, [`RejReason::ConsumerDefined`].
    fn default() -> Rej {
        Rej {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: MessageRejected::Req,
            reject_info_length: 0,
            reason: RejReason::ConsumerDefined,
            ari: [0; REJ_ARI_LEN],
            private_data: [0; REJ_PRIVATE_DATA_LEN],
        }
    }
}

impl Rej {
    /// The meaningful part of the ARI.
    pub fn ari_bytes(&self) -> &[u8] {
        self.ari.get(..usize::from(self.reject_info_length)).unwrap_or(&self.ari)
    }

    pub(super) fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        if usize::from(self.reject_info_length) > REJ_ARI_LEN {
            return Err(MadError::InvalidRejectInfoLength(self.reject_info_length));
        }
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u8(D + 8, self.message_rejected.code() << 6);
        w.u8(D + 9, self.reject_info_length << 1);
        w.u16(D + 10, self.reason.to_u16());
        w.bytes(D + 12, &self.ari);
        w.bytes(D + 84, &self.private_data);
        Ok(())
    }

    pub(super) fn decode_from(r: &Rd<'_>) -> Result<Rej, MadError> {
        let mr = r.u8(D + 8) >> 6;
        let message_rejected = MessageRejected::from_code(mr).ok_or(MadError::InvalidMessageRejected(mr))?;
        let reject_info_length = r.u8(D + 9) >> 1;
        if usize::from(reject_info_length) > REJ_ARI_LEN {
            return Err(MadError::InvalidRejectInfoLength(reject_info_length));
        }
        Ok(Rej {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            message_rejected,
            reject_info_length,
            reason: RejReason::from_u16(r.u16(D + 10)),
            ari: r.array(D + 12),
            private_data: r.array(D + 84),
        })
    }
}

/// Message Receipt Acknowledgement (attribute 0x0011).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    /// Local Comm ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the acknowledged message's Local Comm ID).
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MessageMraed,
    /// Service timeout code (5 bits): how much longer the sender needs.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl Default for Mra {
    /// All fields zero.
    fn default() -> Mra {
        Mra {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_mraed: MessageMraed::Req,
            service_timeout: 0,
            private_data: [0; MRA_PRIVATE_DATA_LEN],
        }
    }
}

impl Mra {
    pub(super) fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let timeout = fit8("service_timeout", self.service_timeout, 5)?;
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u8(D + 8, self.message_mraed.code() << 6);
        w.u8(D + 9, timeout << 3);
        w.bytes(D + 10, &self.private_data);
        Ok(())
    }

    pub(super) fn decode_from(r: &Rd<'_>) -> Result<Mra, MadError> {
        let code = r.u8(D + 8) >> 6;
        let message_mraed = MessageMraed::from_code(code).ok_or(MadError::InvalidMessageMraed(code))?;
        Ok(Mra {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            message_mraed,
            service_timeout: r.u8(D + 9) >> 3,
            private_data: r.array(D + 10),
        })
    }
}

/// DisconnectRequest (attribute 0x0015).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dreq {
    /// Local Comm ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the peer's).
    pub remote_comm_id: u32,
    /// Remote QPN/EECN (24 bits): the peer's QP, which the receiver checks against its own.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl Default for Dreq {
    /// All fields zero.
    fn default() -> Dreq {
        Dreq { local_comm_id: 0, remote_comm_id: 0, remote_qpn: 0, private_data: [0; DREQ_PRIVATE_DATA_LEN] }
    }
}

impl Dreq {
    pub(super) fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let qpn = fit("remote_qpn", self.remote_qpn, 24)?;
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.u32(D + 8, qpn << 8);
        w.bytes(D + 12, &self.private_data);
        Ok(())
    }

    pub(super) fn decode_from(r: &Rd<'_>) -> Dreq {
        Dreq {
            local_comm_id: r.u32(D),
            remote_comm_id: r.u32(D + 4),
            remote_qpn: r.u32(D + 8) >> 8,
            private_data: r.array(D + 12),
        }
    }
}

/// DisconnectReply (attribute 0x0016).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drep {
    /// Local Comm ID (the sender's).
    pub local_comm_id: u32,
    /// Remote Comm ID (the DREQ sender's).
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl Default for Drep {
    /// All fields zero.
    fn default() -> Drep {
        Drep { local_comm_id: 0, remote_comm_id: 0, private_data: [0; DREP_PRIVATE_DATA_LEN] }
    }
}

impl Drep {
    pub(super) fn encode_into(&self, w: &mut Wr<'_>) {
        w.u32(D, self.local_comm_id);
        w.u32(D + 4, self.remote_comm_id);
        w.bytes(D + 8, &self.private_data);
    }

    pub(super) fn decode_from(r: &Rd<'_>) -> Drep {
        Drep { local_comm_id: r.u32(D), remote_comm_id: r.u32(D + 4), private_data: r.array(D + 8) }
    }
}
