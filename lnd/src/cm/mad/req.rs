//! ConnectRequest ([`Req`]) and the path records it carries, with what Linux's rdma_cm puts in
//! a REQ on RoCEv2 ([`Req::roce_defaults`]).
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::net::Ipv4Addr;

use super::{
    D, DEFAULT_PKEY, MadError, PERMISSIVE_LID, REQ_PRIVATE_DATA_LEN, ROCE_CM_RESPONSE_TIMEOUT,
    ROCE_HOP_LIMIT, ROCE_LOCAL_ACK_TIMEOUT, ROCE_MAX_CM_RETRIES, Rd, TransportType, Wr, fit, fit8,
};
use crate::fabric::types::{Gid, Mtu};

/// One path of a REQ (primary or alternate): the fields of a path record the CM carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRecord {
    /// Local port LID (0xFFFF, permissive, on routed RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (the sender's).
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate code (6 bits; 0 = the port's current rate).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Whether the remote port is on the local subnet.
    pub subnet_local: bool,
    /// Local ACK timeout code (5 bits).
    pub local_ack_timeout: u8,
}

/// Bytes a path occupies in a REQ.
const PATH_LEN: usize = 44;

impl PathRecord {
    /// A RoCEv2 path between two IPv4 addresses as rdma_cm fills it: IPv4-mapped GIDs; with
    /// `hop_limit` > 1 (a routed path) LIDs 0xFFFF and Subnet Local 0, otherwise LIDs 0 and
    /// Subnet Local 1; flow label, traffic class, SL and packet rate 0; Local ACK Timeout
    /// [`ROCE_LOCAL_ACK_TIMEOUT`].
    pub const fn roce(local: Ipv4Addr, remote: Ipv4Addr, hop_limit: u8) -> PathRecord {
        let routed = hop_limit > 1;
        let lid = if routed { PERMISSIVE_LID } else { 0 };
        PathRecord {
            local_lid: lid,
            remote_lid: lid,
            local_gid: Gid::from_ipv4(local),
            remote_gid: Gid::from_ipv4(remote),
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit,
            sl: 0,
            subnet_local: !routed,
            local_ack_timeout: ROCE_LOCAL_ACK_TIMEOUT,
        }
    }

    /// The 44 bytes of this path; `alt` picks the field names used in errors.
    fn encode(&self, alt: bool) -> Result<[u8; PATH_LEN], MadError> {
        let name = |p: &'static str, a: &'static str| if alt { a } else { p };
        let flow = fit(name("primary_path.flow_label", "alternate_path.flow_label"), self.flow_label, 20)?;
        let rate = fit8(name("primary_path.packet_rate", "alternate_path.packet_rate"), self.packet_rate, 6)?;
        let sl = fit8(name("primary_path.sl", "alternate_path.sl"), self.sl, 4)?;
        let ack = fit8(
            name("primary_path.local_ack_timeout", "alternate_path.local_ack_timeout"),
            self.local_ack_timeout,
            5,
        )?;
        let mut out = [0u8; PATH_LEN];
        let mut w = Wr(&mut out);
        w.u16(0, self.local_lid);
        w.u16(2, self.remote_lid);
        w.bytes(4, &self.local_gid.0);
        w.bytes(20, &self.remote_gid.0);
        w.u32(36, (flow << 12) | u32::from(rate));
        w.u8(40, self.traffic_class);
        w.u8(41, self.hop_limit);
        w.u8(42, (sl << 4) | (u8::from(self.subnet_local) << 3));
        w.u8(43, ack << 3);
        Ok(out)
    }

    /// The path in the 44 bytes at `off` of `r`; reserved bits are ignored.
    fn decode(r: &Rd<'_>, off: usize) -> PathRecord {
        PathRecord {
            local_lid: r.u16(off),
            remote_lid: r.u16(off + 2),
            local_gid: Gid(r.array(off + 4)),
            remote_gid: Gid(r.array(off + 20)),
            flow_label: r.u32(off + 36) >> 12,
            packet_rate: r.u8(off + 39) & 0x3F,
            traffic_class: r.u8(off + 40),
            hop_limit: r.u8(off + 41),
            sl: r.u8(off + 42) >> 4,
            subnet_local: (r.u8(off + 42) >> 3) & 1 == 1,
            local_ack_timeout: r.u8(off + 43) >> 3,
        }
    }

    /// Whether every field is zero (how a REQ says "no alternate path").
    pub fn is_zero(&self) -> bool {
        *self == PathRecord::default()
    }
}

/// ConnectRequest (attribute 0x0010).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    /// Local Comm ID (nonzero, unique per live connection of the sender).
    pub local_comm_id: u32,
    /// Service ID (for rdma_cm, see [`crate::cm::ip_cm::ip_service_id`]).
    pub service_id: u64,
    /// Local CA GUID (the sender's node GUID).
    pub local_ca_guid: u64,
    /// Local Q_Key (0 for RC).
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources: RDMA READ/atomic depth the sender accepts as responder.
    pub responder_resources: u8,
    /// Local EECN (24 bits; 0 unless RD).
    pub local_eecn: u32,
    /// Initiator depth: RDMA READ/atomic the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits; 0 unless RD).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout code (5 bits): how long the sender waits for a REP.
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport_type: TransportType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits): where the REQ's sender starts sending (IBTA; the receiver of
    /// the REQ expects it first). Linux's ib_cm reads it the other way round: see the PSN rule
    /// in [`crate::cm::manager`].
    pub starting_psn: u32,
    /// Local CM Response Timeout code (5 bits): how long the sender takes to answer.
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// RDC exists (RD only).
    pub rdc_exists: bool,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses a shared receive queue.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary_path: PathRecord,
    /// The alternate path; `None` is sent as 44 zero bytes, and a zero path decodes as `None`.
    pub alternate_path: Option<PathRecord>,
    /// SAP supported (bit 2 of byte 139, next to the alternate path's ACK timeout).
    pub sap_supported: bool,
    /// Private data (for rdma_cm: the IP CM header, then consumer data).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Default for Req {
    /// All fields zero (RC, 4096-byte MTU, no alternate path).
    fn default() -> Req {
        Req {
            local_comm_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: 0,
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_type: TransportType::Rc,
            end_to_end_flow_control: false,
            starting_psn: 0,
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: 0,
            path_mtu: Mtu::default(),
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport_type: 0,
            primary_path: PathRecord::default(),
            alternate_path: None,
            sap_supported: false,
            private_data: [0; REQ_PRIVATE_DATA_LEN],
        }
    }
}

/// What the caller chooses in a RoCE REQ; [`Req::roce_defaults`] fills the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoceReqParams {
    /// Local Comm ID (nonzero).
    pub local_comm_id: u32,
    /// Service ID (`ip_service_id(PortSpace::Tcp, port)` for rdma_cm).
    pub service_id: u64,
    /// The sender's node GUID (rxe: the EUI-64 of the MAC).
    pub local_ca_guid: u64,
    /// The sender's QP number (24 bits).
    pub local_qpn: u32,
    /// Random 24-bit PSN at which the sender of this REQ will start sending.
    pub starting_psn: u32,
    /// The sender's IPv4 address.
    pub local_ip: Ipv4Addr,
    /// The receiver's IPv4 address.
    pub remote_ip: Ipv4Addr,
    /// Path MTU (netdev MTU − 96 rounded down: 1500 → 1024, 9000 → 4096).
    pub path_mtu: Mtu,
    /// Responder resources (o2iblnd: 0, no RDMA READ).
    pub responder_resources: u8,
    /// Initiator depth (o2iblnd: 0).
    pub initiator_depth: u8,
    /// End-to-end flow control (o2iblnd sets it).
    pub flow_control: bool,
    /// Transport retry count (≤ 7).
    pub retry_count: u8,
    /// RNR retry count (≤ 7, 7 = infinite).
    pub rnr_retry_count: u8,
    /// Private data (`crate::cm::ip_cm::req_private_data`).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Req {
    /// A REQ as Linux rdma_cm sends it on RoCEv2 ("REQ on RoCE"): RC, Q_Key 0, P_Key 0xFFFF,
    /// both CM response timeouts [`ROCE_CM_RESPONSE_TIMEOUT`] (20), Max CM Retries 15, no RDC,
    /// no SRQ, no extended transport, primary path [`PathRecord::roce`] with hop limit 64
    /// (LIDs 0xFFFF, Subnet Local 0, ACK timeout 17), no alternate path, SAP not supported.
    ///
    /// Out-of-range values in `p` (a QPN over 24 bits, a retry count over 7) are kept as given
    /// and make [`CmMad::encode`](super::CmMad::encode) fail.
    pub fn roce_defaults(p: RoceReqParams) -> Req {
        Req {
            local_comm_id: p.local_comm_id,
            service_id: p.service_id,
            local_ca_guid: p.local_ca_guid,
            local_qkey: 0,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: ROCE_CM_RESPONSE_TIMEOUT,
            transport_type: TransportType::Rc,
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: ROCE_CM_RESPONSE_TIMEOUT,
            retry_count: p.retry_count,
            pkey: DEFAULT_PKEY,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: ROCE_MAX_CM_RETRIES,
            srq: false,
            extended_transport_type: 0,
            primary_path: PathRecord::roce(p.local_ip, p.remote_ip, ROCE_HOP_LIMIT),
            alternate_path: None,
            sap_supported: false,
            private_data: p.private_data,
        }
    }

    pub(super) fn encode_into(&self, w: &mut Wr<'_>) -> Result<(), MadError> {
        let qpn = fit("local_qpn", self.local_qpn, 24)?;
        let leecn = fit("local_eecn", self.local_eecn, 24)?;
        let reecn = fit("remote_eecn", self.remote_eecn, 24)?;
        let rcrt = fit8("remote_cm_response_timeout", self.remote_cm_response_timeout, 5)?;
        let psn = fit("starting_psn", self.starting_psn, 24)?;
        let lcrt = fit8("local_cm_response_timeout", self.local_cm_response_timeout, 5)?;
        let retry = fit8("retry_count", self.retry_count, 3)?;
        let rnr = fit8("rnr_retry_count", self.rnr_retry_count, 3)?;
        let cm_retries = fit8("max_cm_retries", self.max_cm_retries, 4)?;
        let ext = fit8("extended_transport_type", self.extended_transport_type, 3)?;
        let primary = self.primary_path.encode(false)?;
        let mut alternate = match &self.alternate_path {
            Some(path) => path.encode(true)?,
            None => [0u8; PATH_LEN],
        };
        if let Some(last) = alternate.last_mut() {
            *last |= u8::from(self.sap_supported) << 2;
        }

        w.u32(D, self.local_comm_id);
        w.u64(D + 8, self.service_id);
        w.u64(D + 16, self.local_ca_guid);
        w.u32(D + 28, self.local_qkey);
        w.u32(D + 32, (qpn << 8) | u32::from(self.responder_resources));
        w.u32(D + 36, (leecn << 8) | u32::from(self.initiator_depth));
        let b43 = (rcrt << 3) | (self.transport_type.code() << 1) | u8::from(self.end_to_end_flow_control);
        w.u32(D + 40, (reecn << 8) | u32::from(b43));
        w.u32(D + 44, (psn << 8) | u32::from((lcrt << 3) | retry));
        w.u16(D + 48, self.pkey);
        w.u8(D + 50, (self.path_mtu.code() << 4) | (u8::from(self.rdc_exists) << 3) | rnr);
        w.u8(D + 51, (cm_retries << 4) | (u8::from(self.srq) << 3) | ext);
        w.bytes(D + 52, &primary);
        w.bytes(D + 96, &alternate);
        w.bytes(D + 140, &self.private_data);
        Ok(())
    }

    pub(super) fn decode_from(r: &Rd<'_>) -> Result<Req, MadError> {
        let tt = (r.u8(D + 43) >> 1) & 3;
        let transport_type = TransportType::from_code(tt).ok_or(MadError::InvalidTransportType(tt))?;
        let mtu_code = r.u8(D + 50) >> 4;
        let path_mtu = Mtu::from_code(mtu_code).ok_or(MadError::InvalidMtu(mtu_code))?;
        let alternate = PathRecord::decode(r, D + 96);
        Ok(Req {
            local_comm_id: r.u32(D),
            service_id: r.u64(D + 8),
            local_ca_guid: r.u64(D + 16),
            local_qkey: r.u32(D + 28),
            local_qpn: r.u32(D + 32) >> 8,
            responder_resources: r.u8(D + 35),
            local_eecn: r.u32(D + 36) >> 8,
            initiator_depth: r.u8(D + 39),
            remote_eecn: r.u32(D + 40) >> 8,
            remote_cm_response_timeout: r.u8(D + 43) >> 3,
            transport_type,
            end_to_end_flow_control: r.u8(D + 43) & 1 == 1,
            starting_psn: r.u32(D + 44) >> 8,
            local_cm_response_timeout: r.u8(D + 47) >> 3,
            retry_count: r.u8(D + 47) & 7,
            pkey: r.u16(D + 48),
            path_mtu,
            rdc_exists: (r.u8(D + 50) >> 3) & 1 == 1,
            rnr_retry_count: r.u8(D + 50) & 7,
            max_cm_retries: r.u8(D + 51) >> 4,
            srq: (r.u8(D + 51) >> 3) & 1 == 1,
            extended_transport_type: r.u8(D + 51) & 7,
            primary_path: PathRecord::decode(r, D + 52),
            alternate_path: if alternate.is_zero() { None } else { Some(alternate) },
            sap_supported: (r.u8(D + 139) >> 2) & 1 == 1,
            private_data: r.array(D + 140),
        })
    }
}
