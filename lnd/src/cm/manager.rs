//! The InfiniBand connection manager as a sans-IO state machine ([`Cm`]).
//!
//! One [`Cm`] per local port owns the CM state of every connection attempt on that port: comm
//! IDs, retransmission timers, duplicate detection, TIMEWAIT. It never touches a device, a socket
//! or a clock. Its user (the LND engine) feeds it received MADs and the current time, drains the
//! MADs it wants sent and the events it reports, and creates and modifies QPs itself. How MADs
//! travel (QP1 on the software fabric, a TCP side channel on the real-NIC backend) is no concern
//! of this module.
//!
//! # Driving a `Cm`
//! * Inputs: [`Cm::handle_mad`] for every CM MAD received on the port (with its source address),
//!   [`Cm::handle_timeout`] whenever the deadline of [`Cm::poll_timeout`] has passed (earlier
//!   calls are harmless no-ops), and the user calls ([`Cm::listen`], [`Cm::connect`],
//!   [`Cm::accept`], [`Cm::reject`], [`Cm::complete_connect`], [`Cm::notify_comm_est`],
//!   [`Cm::disconnect`], [`Cm::destroy`]). Every input that can start a timer takes `now`.
//! * After **any** input, drain [`Cm::poll_transmit`] (hand each `(dest, mad)` to
//!   `device.send_mad`) and [`Cm::poll_event`] until both return `None`, then re-read
//!   [`Cm::poll_timeout`] and sleep at most until then. Nothing is sent or reported behind the
//!   caller's back.
//!
//! Active side: `connect` (REQ) → [`CmEvent::Reply`] → the user moves its QP INIT→RTR→RTS with
//! the peer's QPN and PSN → `complete_connect` (RTU) → [`CmEvent::Established`]. Failures end
//! the attempt with [`CmEvent::Rejected`] or [`CmEvent::Unreachable`].
//!
//! Passive side: `listen(service_id)` → [`CmEvent::ConnectRequest`] → the user creates its QP
//! and moves it to RTS (Linux does so *before* sending the REP) → `accept` (REP) or `reject`
//! (REJ) → [`CmEvent::Established`] on the RTU, or earlier when the user reports the QP's first
//! inbound packet with `notify_comm_est` (IB `COMM_EST` → `rdma_notify`, which makes a lost RTU
//! harmless). Failures: [`CmEvent::Rejected`], [`CmEvent::ReplyTimedOut`].
//!
//! Either side: `disconnect` (DREQ) → [`CmEvent::Disconnected`] when the DREP arrives or the
//! DREQ retries run out; a DREQ from the peer is answered with a DREP at once and also reported
//! as [`CmEvent::Disconnected`]. The id then sits in TIMEWAIT for [`CmConfig::timewait`] and is
//! forgotten. Every id reaches exactly one terminal event (`Rejected`, `Unreachable`,
//! `ReplyTimedOut` or `Disconnected`) unless the user ends it first ([`Cm::reject`],
//! [`Cm::destroy`]), and is freed by the CM itself afterwards (at once, or when its TIMEWAIT
//! ends); the user never has to free ids, and [`Cm::live`] counts the ids still held, for leak
//! checks. [`Cm::destroy`] forgets an id at any time, telling the peer as Linux does. Calls
//! naming an id the CM no longer holds fail with [`CmError::UnknownId`] (or do nothing, for
//! `notify_comm_est` and `destroy`).
//!
//! # Wire behaviour (Linux `cm.c`)
//! * **Transaction IDs.** REQ and DREQ use [`cm_tid`]`(hi, local comm id)` with a per-`Cm`
//!   `hi` drawn from the seeded generator; REP, REJ, MRA and RTU copy the REQ's TID, a DREP
//!   the TID of the DREQ it answers. Receivers match comm IDs, never TIDs.
//! * **Comm IDs** are drawn from the seeded [`Rng`]: nonzero and unique among live ids.
//! * **Retransmission** resends the identical 256 bytes. REQ timer = 2·2^(PLT−8) +
//!   2^(CMRespTimeout−8) ms ([`linux_cm_timeout`] of [`CmConfig::packet_life_time`] and
//!   [`CmConfig::cm_response_timeout`]), up to [`CmConfig::max_cm_retries`] resends, then
//!   [`CmEvent::Unreachable`]. REP timer = 2^(REQ.LocalCMResponseTimeout−8) ms, up to the REQ's
//!   Max CM Retries, then [`CmEvent::ReplyTimedOut`]. A DREQ uses the side's own timer (REQ
//!   timer on the active side, REP timer on the passive side) and retries, then TIMEWAIT and
//!   [`CmEvent::Disconnected`]. The elapsed time until a give-up is therefore
//!   `(retries + 1) × timer`.
//! * **MRA** is honoured, never sent: an MRA for our REQ (or REP) replaces the running
//!   per-attempt timeout with 2^(ServiceTimeout−8) + 2^(AckTimeout−8) ms, re-armed from its
//!   arrival; the retry budget is unchanged (Linux `ib_modify_mad`).
//! * **A received REQ** is checked in Linux's order: (1) *duplicate* — (remote comm ID, remote
//!   CA GUID) already known: dropped and counted, whatever the state (REQ_RCVD, REP_SENT,
//!   ESTABLISHED; Linux's `cm_dup_req_handler` does **not** resend the REP, which has its own
//!   timer), except in TIMEWAIT, where it is answered with REJ 10; (2) *stale* — (remote QPN,
//!   remote CA GUID) belongs to a live connection: REJ 10 (stale connection), and a DREQ to that
//!   old connection if it is established; (3) *no listener* on the Service ID: REJ 8. This CM
//!   then also refuses what it cannot serve: a non-RC transport (REJ 9), a primary remote GID
//!   other than the port's (REJ 12, ARI = the port GID), an unparsable IP CM header or one whose
//!   destination is not [`CmConfig::local_ip`] (REJ 28 without data, as rdma_cm does), a comm ID
//!   of 0 (dropped), and requests beyond [`CmConfig::max_pending_requests`] not yet accepted or
//!   rejected (REJ 3, no resources) — the bound on what a REQ flood can make it hold.
//! * **REP**: duplicate REP in ESTABLISHED → the RTU is resent; a REP whose (QPN, CA GUID)
//!   belongs to another live connection → REJ 10 and a DREQ to that connection.
//! * **REJ** ends an attempt in REQ_SENT, REQ_RCVD, REP_SENT or REP_RCVD with
//!   [`CmEvent::Rejected`] (reason 8 means nobody listens); TIMEWAIT follows for reason 10 and
//!   in REP_RCVD, as in Linux. A REJ 4 (timeout) is matched by the ARI's CA GUID and the
//!   rejecter's comm ID, like `cm_acquire_rejected_id`.
//! * **DREQ** is ignored unless its Remote QPN is the id's local QPN; in ESTABLISHED, REP_SENT
//!   or DREQ_SENT it is answered with a DREP → TIMEWAIT; in TIMEWAIT the DREP is resent; a DREQ
//!   for an unknown comm ID is answered with a DREP anyway (IDs swapped, TID copied).
//! * **TIMEWAIT** lasts [`CmConfig::timewait`]. Entering it drops the (QPN, CA GUID) key, so the
//!   peer may reuse the QPN at once, but keeps the (comm ID, CA GUID) key, so a late duplicate
//!   REQ draws REJ 10 instead of becoming a new request.
//! * **REQ contents**: [`Req::roce_defaults`] from the [`ConnectParams`] (RC, P_Key 0xFFFF,
//!   permissive LIDs, hop limit 64, flow control on as o2iblnd asks), with both CM response
//!   timeouts and Max CM Retries from the [`CmConfig`], the GIDs of the two [`PortAddr`]s, the
//!   path's Local ACK Timeout from the parameters, and the private data
//!   `req_private_data(&CmaHeader { src_port, src: local_ip, dst: dest_ip }, &private_data)`.
//!   REPs carry responder resources and initiator depth 0 (o2iblnd issues no RDMA READ),
//!   end-to-end flow control on, failover "accepted" (0) as Linux writes it, no SRQ.
//!
//! # Choices where Linux or the IBTA leave room
//! * A REJ received while ESTABLISHED or DREQ_SENT is reported as [`CmEvent::Disconnected`]
//!   (Linux reports REJECTED), since the user's reaction is a disconnect's.
//! * A REP refused as stale ends our attempt with `Rejected { reason: StaleConn }` and TIMEWAIT
//!   (Linux leaves the id in REQ_SENT until its REQ retries run out).
//! * The active side reports [`CmEvent::Established`] after `complete_connect` too, so both sides
//!   start work on the same event.
//! * A DREQ is answered by the CM itself (o2iblnd always answers with `rdma_disconnect`), so
//!   there is no DREQ_RCVD state for the user to act in.
//! * [`Cm::destroy`] frees the id at once: REJ 4 (ARI = CA GUID) in REQ_SENT, REJ 28 before
//!   establishment, one unretransmitted DREQ when established, as `cm_destroy_id` does.
//!
//! # The PSN rule
//! Each side picks its own send-queue start PSN and sends it in its REQ/REP
//! ([`ConnectParams::start_psn`], the `start_psn` of [`Cm::accept`]); the peer adopts it as the
//! expected PSN (ePSN) of its receive queue (IBTA, seed 000: "set the new QP's RQ ePSN = the
//! start PSN assigned to the requester's SQ"). The events report the peer's value as
//! `remote_start_psn`. The CM only carries the number; which QP attribute it lands in is the
//! user's business. **Known difference:** Linux's ib_cm reads the field the other way round — it
//! carries the PSN the *sender expects to receive*: `ib_send_cm_req` sets its own `rq_psn` to the
//! REQ's Starting PSN and the passive side uses it as its `sq_psn` (likewise for the REP). Both
//! readings work when both ends use the same one; against a Linux peer the user must apply
//! Linux's reading (send from the peer's number, expect its own).
//!
//! # Contract
//! * **No panics on peer input**: any byte string given to [`Cm::handle_mad`] is decoded or
//!   counted in [`CmStats`] and dropped (a seeded fuzz loop in the tests holds this up).
//! * **Bounded**: pending requests are capped ([`CmConfig::max_pending_requests`]), the transmit
//!   queue holds at most [`TRANSMIT_QUEUE_LIMIT`] MADs (overflow is counted and dropped; the
//!   protocol's retransmissions recover), and every other piece of state belongs to an id the
//!   local user created or accepted. Events are queued until polled: a user that drains
//!   [`Cm::poll_event`] after each input, as above, never holds more than a handful.
//! * **Deterministic**: identical inputs and seed give identical output bytes, events and
//!   timers. Output order never depends on hash-map iteration; timers live in a `BTreeMap`
//!   ordered by (deadline, arming sequence).
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::net::Ipv4Addr;
use std::time::Duration;

use lnet_shim::hash::FastMap;

use super::ip_cm::{CmaHeader, REQ_CONSUMER_DATA_LEN, req_private_data};
use super::mad::{
    CmMad, CmMessage, Dreq, FailoverAccepted, MadError, MessageRejected, REJ_PRIVATE_DATA_LEN,
    REP_PRIVATE_DATA_LEN, ROCE_LOCAL_ACK_TIMEOUT, ROCE_PACKET_LIFETIME, Rej, RejReason, Rep, Req,
    RoceReqParams, Rtu, attr, cm_tid, linux_cm_timeout,
};
use crate::fabric::types::{Mad, Mtu, PortAddr};
use crate::rng::Rng;
use crate::time::Instant;

mod recv;

/// Default bound on connection requests received but not yet accepted or rejected.
pub const DEFAULT_MAX_PENDING_REQUESTS: usize = 1024;
/// Most MADs [`Cm::poll_transmit`] can have queued; later ones are dropped and counted in
/// [`CmStats::transmit_overflow`].
pub const TRANSMIT_QUEUE_LIMIT: usize = 8192;
/// Largest CM response timeout, packet lifetime and ACK timeout code (5 bits).
const MAX_TIME_CODE: u8 = 31;
/// Largest Max CM Retries (4 bits).
const MAX_CM_RETRIES: u8 = 15;

/// How a [`Cm`] behaves on its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmConfig {
    /// The local port's fabric address: its GID goes into REQs as the primary local GID, and
    /// REQs whose primary remote GID differs are refused with REJ 12.
    pub local: PortAddr,
    /// The local port's IPv4 address: the source address in the IP CM header of REQs sent, and
    /// the destination a received REQ's IP CM header must name (unless unspecified, 0.0.0.0).
    pub local_ip: Ipv4Addr,
    /// The local node GUID (Local CA GUID in REQ/REP, ARI of REJ 4).
    pub ca_guid: u64,
    /// CM response timeout code put in both REQ timeout fields (Linux: 20 on RoCE ≈ 4 s;
    /// smaller codes suit the software fabric). Clamped to 31.
    pub cm_response_timeout: u8,
    /// Max CM Retries for REQs (and this side's DREQs when active); Linux: 15. Clamped to 15.
    pub max_cm_retries: u8,
    /// Packet lifetime code for the REQ timer formula (rdma_cm on RoCE: 16 or 18). Clamped to 31.
    pub packet_life_time: u8,
    /// How long an id stays in TIMEWAIT before it is forgotten.
    pub timewait: Duration,
    /// Most connection requests held in REQ_RCVD (received, not yet accepted or rejected); more
    /// are refused with REJ 3 (no resources).
    pub max_pending_requests: usize,
    /// This CM's share of the comm ID space, `(index, count)`: every local comm ID it
    /// allocates is `index` modulo `count`, so a MAD naming one (REP, RTU, REJ, MRA, DREQ,
    /// DREP) can be routed to its CM when several share one port (the driver's scheduler
    /// shards). `(0, 1)`: the whole space.
    pub id_partition: (u32, u32),
}

impl CmConfig {
    /// The configuration Linux rdma_cm uses on RoCE: CM response timeout 20, 15 retries, packet
    /// lifetime 16, TIMEWAIT 2^(17−8) ms (the path's ACK timeout), and
    /// [`DEFAULT_MAX_PENDING_REQUESTS`].
    pub fn roce(local: PortAddr, local_ip: Ipv4Addr, ca_guid: u64) -> CmConfig {
        CmConfig {
            local,
            local_ip,
            ca_guid,
            cm_response_timeout: super::mad::ROCE_CM_RESPONSE_TIMEOUT,
            max_cm_retries: super::mad::ROCE_MAX_CM_RETRIES,
            packet_life_time: ROCE_PACKET_LIFETIME,
            timewait: linux_cm_timeout(ROCE_LOCAL_ACK_TIMEOUT),
            max_pending_requests: DEFAULT_MAX_PENDING_REQUESTS,
            id_partition: (0, 1),
        }
    }

    /// The REQ retransmission timer: 2·2^(PLT−8) + 2^(CMRespTimeout−8) ms.
    pub fn req_timeout(&self) -> Duration {
        linux_cm_timeout(self.packet_life_time) * 2 + linux_cm_timeout(self.cm_response_timeout)
    }
}

/// A local communication ID: the handle of one connection in a [`Cm`]. Nonzero, unique among
/// the ids the `Cm` holds; it is the Local Comm ID of the MADs this side sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cm#{:08x}", self.0)
    }
}

/// What [`Cm::connect`] needs to build a REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The passive side's port address (where the REQ goes).
    pub dest: PortAddr,
    /// The passive side's IPv4 address (IP CM header destination).
    pub dest_ip: Ipv4Addr,
    /// The active side's source port (IP CM header).
    pub src_port: u16,
    /// The Service ID (`ip_service_id(PortSpace::Tcp, 987)` for o2iblnd).
    pub service_id: u64,
    /// The local QP number (24 bits).
    pub qpn: u32,
    /// The local QP's send-queue start PSN (24 bits); see the module's PSN rule.
    pub start_psn: u32,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Transport retry count (≤ 7).
    pub retry_count: u8,
    /// RNR retry count (≤ 7; 7 = infinite).
    pub rnr_retry_count: u8,
    /// RDMA READ/atomic depth this side accepts as responder (o2iblnd: 0).
    pub responder_resources: u8,
    /// RDMA READ/atomic this side issues at once (o2iblnd: 0).
    pub initiator_depth: u8,
    /// The path's Local ACK Timeout code (≤ 31), also used for the MRA timer.
    pub local_ack_timeout: u8,
    /// Consumer private data, placed after the 36-byte IP CM header.
    pub private_data: [u8; REQ_CONSUMER_DATA_LEN],
}

/// The CM state of a connection (Linux `enum ib_cm_state`, minus the states this CM never holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnState {
    /// Active: REQ sent, waiting for REP/REJ/MRA.
    ReqSent,
    /// Active: the peer acknowledged the REQ with an MRA; waiting longer.
    MraReqRcvd,
    /// Passive: REQ received, waiting for the user to accept or reject.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU (or COMM_EST).
    RepSent,
    /// Passive: the peer acknowledged the REP with an MRA; waiting longer.
    MraRepRcvd,
    /// Active: REP received, waiting for the user to complete the connection.
    RepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Disconnected or rejected; held until the TIMEWAIT ends.
    Timewait,
}

/// Something the user of a [`Cm`] must learn about; drained with [`Cm::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "events carry the MADs' private data by value, as Linux reports it"
)]
pub enum CmEvent {
    /// Passive: a REQ for a listened Service ID passed every check. Answer with [`Cm::accept`]
    /// or [`Cm::reject`] (or [`Cm::destroy`]).
    ConnectRequest {
        /// The new id.
        id: ConnId,
        /// Where the REQ came from (replies go there).
        from: PortAddr,
        /// The Service ID asked for.
        service_id: u64,
        /// The IP CM header of the REQ's private data.
        cma: CmaHeader,
        /// The consumer private data after the IP CM header.
        private_data: [u8; REQ_CONSUMER_DATA_LEN],
        /// The requester's QPN.
        remote_qpn: u32,
        /// The requester's Starting PSN (see the module's PSN rule).
        remote_start_psn: u32,
        /// Path MTU.
        path_mtu: Mtu,
        /// Transport retry count asked for.
        retry_count: u8,
        /// RNR retry count asked for.
        rnr_retry_count: u8,
        /// RDMA READ depth *this* side must accept as responder (the REQ's Initiator Depth;
        /// Linux swaps the two fields the same way).
        responder_resources: u8,
        /// RDMA READ depth *this* side may issue (the REQ's Responder Resources).
        initiator_depth: u8,
        /// The path's Local ACK Timeout code.
        local_ack_timeout: u8,
        /// The requester's CA GUID.
        remote_ca_guid: u64,
    },
    /// Active: the peer accepted. Move the QP to RTR/RTS, then call [`Cm::complete_connect`]
    /// (or [`Cm::reject`] / [`Cm::destroy`]).
    Reply {
        /// The id.
        id: ConnId,
        /// The peer's QPN.
        remote_qpn: u32,
        /// The peer's Starting PSN (see the module's PSN rule).
        remote_start_psn: u32,
        /// The REP's whole private-data field.
        private_data: [u8; REP_PRIVATE_DATA_LEN],
        /// The RNR retry count the peer asks for.
        rnr_retry_count: u8,
    },
    /// The connection is up: passive on RTU or [`Cm::notify_comm_est`], active after
    /// [`Cm::complete_connect`].
    Established {
        /// The id.
        id: ConnId,
    },
    /// A REJ ended the attempt (reason 8: no listener, 28: consumer reject with private data).
    /// The id is forgotten (after TIMEWAIT for some reasons).
    Rejected {
        /// The id.
        id: ConnId,
        /// Why.
        reason: RejReason,
        /// The REJ's whole private-data field.
        private_data: [u8; REJ_PRIVATE_DATA_LEN],
    },
    /// Active: no REP or REJ came after every REQ retry. The id is forgotten.
    Unreachable {
        /// The id.
        id: ConnId,
    },
    /// Passive: no RTU (and no COMM_EST) came after every REP retry. The id is forgotten.
    ReplyTimedOut {
        /// The id.
        id: ConnId,
    },
    /// The connection is over: a DREQ was received (and answered with a DREP), our DREQ got its
    /// DREP or ran out of retries, or a REJ hit an established connection. TIMEWAIT follows.
    Disconnected {
        /// The id.
        id: ConnId,
    },
}

impl CmEvent {
    /// The id the event is about.
    pub fn id(&self) -> ConnId {
        match self {
            CmEvent::ConnectRequest { id, .. }
            | CmEvent::Reply { id, .. }
            | CmEvent::Established { id }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id }
            | CmEvent::ReplyTimedOut { id }
            | CmEvent::Disconnected { id } => *id,
        }
    }
}

/// Why a user call on a [`Cm`] failed. Nothing was sent and no state changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The id is not (or no longer) held by this `Cm`.
    #[error("unknown connection id {0}")]
    UnknownId(ConnId),
    /// The id is in a state where the operation does not apply.
    #[error("{op} is not possible on {id} in state {state:?}")]
    InvalidState {
        /// The id.
        id: ConnId,
        /// Its state.
        state: ConnState,
        /// The operation attempted.
        op: &'static str,
    },
    /// More private data than the message carries.
    #[error("private data is {len} bytes, at most {max} fit")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Bytes the message carries.
        max: usize,
    },
    /// A parameter does not fit its MAD field (a QPN or PSN over 24 bits, a retry count over 7,
    /// a time code over 31).
    #[error("cannot encode the CM message: {0}")]
    Encode(#[from] MadError),
}

/// One counter per CM message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MsgCounts {
    /// ConnectRequest.
    pub req: u64,
    /// ConnectReply.
    pub rep: u64,
    /// ReadyToUse.
    pub rtu: u64,
    /// ConnectReject.
    pub rej: u64,
    /// Message Receipt Acknowledgement.
    pub mra: u64,
    /// DisconnectRequest.
    pub dreq: u64,
    /// DisconnectReply.
    pub drep: u64,
}

impl MsgCounts {
    /// The sum over all types.
    pub fn total(&self) -> u64 {
        self.req + self.rep + self.rtu + self.rej + self.mra + self.dreq + self.drep
    }

    fn bump(&mut self, attr_id: u16) {
        let c = match attr_id {
            attr::REQ => &mut self.req,
            attr::REP => &mut self.rep,
            attr::RTU => &mut self.rtu,
            attr::REJ => &mut self.rej,
            attr::MRA => &mut self.mra,
            attr::DREQ => &mut self.dreq,
            attr::DREP => &mut self.drep,
            _ => return,
        };
        *c += 1;
    }
}

/// Counters of a [`Cm`] ([`Cm::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmStats {
    /// MADs queued for transmission, retransmissions included.
    pub sent: MsgCounts,
    /// MADs received and decoded.
    pub received: MsgCounts,
    /// Timer-driven resends (REQ, REP, DREQ) — a subset of `sent`.
    pub retransmitted: MsgCounts,
    /// Received duplicates (a REQ already known, a REP or RTU for an established id, a DREQ in
    /// TIMEWAIT, a second MRA, a DREP in TIMEWAIT).
    pub duplicates: MsgCounts,
    /// Received byte strings that are not a valid CM MAD (dropped).
    pub undecodable: u64,
    /// Valid MADs of an attribute this CM does not handle (ClassPortInfo, SIDR, LAP/APR; dropped).
    pub unsupported: u64,
    /// Messages naming no id this CM holds (dropped; a DREQ is still answered with a DREP).
    pub unknown_comm_id: u64,
    /// Messages for a held id in a state where they mean nothing (dropped).
    pub unexpected_state: u64,
    /// DREQs whose Remote QPN is not the id's local QPN (dropped).
    pub dreq_qpn_mismatch: u64,
    /// REQs refused for their content (comm ID 0, transport, GID, IP CM header).
    pub invalid_req: u64,
    /// REQs refused with REJ 8 (no listener).
    pub rej_invalid_service_id: u64,
    /// REQs or REPs refused with REJ 10 (stale connection).
    pub rej_stale_conn: u64,
    /// REQs refused with REJ 3 because [`CmConfig::max_pending_requests`] were pending.
    pub rej_no_resources: u64,
    /// Attempts given up after the last REQ retry ([`CmEvent::Unreachable`]).
    pub req_timeouts: u64,
    /// Attempts given up after the last REP retry ([`CmEvent::ReplyTimedOut`]).
    pub rep_timeouts: u64,
    /// Disconnects completed by DREQ timeout rather than DREP.
    pub dreq_timeouts: u64,
    /// MADs dropped because the transmit queue held [`TRANSMIT_QUEUE_LIMIT`] already.
    pub transmit_overflow: u64,
    /// Internal messages that failed to encode (a bug; dropped, never a panic).
    pub encode_errors: u64,
}

/// The CM state of one id.
#[derive(Debug, Clone)]
struct Conn {
    state: ConnState,
    /// Where this side's MADs for the connection go.
    peer: PortAddr,
    /// The REQ's transaction ID (sent or received); REP, REJ, MRA and RTU copy it.
    tid: u64,
    /// The peer's comm ID; 0 until known (active side before the REP).
    remote_comm_id: u32,
    /// The peer's CA GUID; 0 until known.
    remote_ca_guid: u64,
    /// The local QPN (0 on the passive side until accepted).
    local_qpn: u32,
    /// The peer's QPN (0 on the active side until the REP).
    remote_qpn: u32,
    /// Linux `timeout_ms`: REQ timer (active) or REP timer (passive); also the DREQ timer.
    base_timeout: Duration,
    /// Per-attempt timeout of the outstanding MAD (an MRA can raise it).
    cur_timeout: Duration,
    /// Max CM retries for this side's REQ/REP/DREQ.
    max_retries: u8,
    /// Resends left for the outstanding MAD.
    retries_left: u8,
    /// The path's ACK timeout code (MRA timer).
    ack_timeout: u8,
    /// The MAD the timer resends (REQ, REP or DREQ).
    outstanding: Option<Mad>,
    /// The RTU this side sent, resent on a duplicate REP.
    rtu: Option<Mad>,
    /// The armed timer's key in [`Cm::timers`].
    timer: Option<(Instant, u64)>,
    /// Registered under (remote comm ID, remote CA GUID).
    remote_id_key: bool,
    /// Registered under (remote QPN, remote CA GUID).
    remote_qpn_key: bool,
}

/// The IB connection manager of one port: see the module documentation.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    rng: Rng,
    /// High 32 bits of the TIDs of REQs and DREQs.
    tid_hi: u32,
    conns: FastMap<u32, Conn>,
    listeners: BTreeSet<u64>,
    /// (remote comm ID, remote CA GUID) → local comm ID: duplicate REQ/REP detection.
    by_remote_id: FastMap<(u32, u64), u32>,
    /// (remote QPN, remote CA GUID) → local comm ID: stale connection detection.
    by_remote_qpn: FastMap<(u32, u64), u32>,
    /// (deadline, arming sequence) → local comm ID.
    timers: BTreeMap<(Instant, u64), u32>,
    timer_seq: u64,
    pending_requests: usize,
    tx: VecDeque<(PortAddr, Mad)>,
    events: VecDeque<CmEvent>,
    stats: CmStats,
}

/// `data` copied into a zero-filled array (truncated if longer; callers check lengths).
fn padded<const N: usize>(data: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let n = data.len().min(N);
    if let (Some(dst), Some(src)) = (out.get_mut(..n), data.get(..n)) {
        dst.copy_from_slice(src);
    }
    out
}

/// A REJ with everything but the ARI and private data.
fn rej(local: u32, remote: u32, message_rejected: MessageRejected, reason: RejReason) -> Rej {
    Rej { local_comm_id: local, remote_comm_id: remote, message_rejected, reason, ..Rej::default() }
}

impl Cm {
    /// A CM for one port. `seed` drives every random choice (comm IDs, the TID high word), so
    /// a run replays from it. Time codes above 31 and retries above 15 are clamped.
    pub fn new(mut config: CmConfig, seed: u64) -> Cm {
        config.cm_response_timeout = config.cm_response_timeout.min(MAX_TIME_CODE);
        config.packet_life_time = config.packet_life_time.min(MAX_TIME_CODE);
        config.max_cm_retries = config.max_cm_retries.min(MAX_CM_RETRIES);
        let mut rng = Rng::new(seed);
        let tid_hi = rng.next_u32();
        Cm {
            cfg: config,
            rng,
            tid_hi,
            conns: FastMap::default(),
            listeners: BTreeSet::new(),
            by_remote_id: FastMap::default(),
            by_remote_qpn: FastMap::default(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            pending_requests: 0,
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The configuration in use (after clamping).
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// The TID of a REQ or DREQ sent for `id`: `(hi << 32) | id`.
    pub fn tid_of(&self, id: ConnId) -> u64 {
        cm_tid(self.tid_hi, id.0)
    }

    /// Accept REQs for `service_id` from now on ([`CmEvent::ConnectRequest`]). REQs for Service
    /// IDs nobody listens on are refused with REJ 8.
    pub fn listen(&mut self, service_id: u64) {
        self.listeners.insert(service_id);
    }

    /// Stop accepting REQs for `service_id`. Requests already reported stay the user's to answer.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// Starts an active connection: sends a REQ and arms the REQ timer. Next:
    /// [`CmEvent::Reply`] (then [`Cm::complete_connect`]), or a failure event.
    ///
    /// Fails with [`CmError::Encode`] if a parameter does not fit its REQ field.
    pub fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<ConnId, CmError> {
        let id = self.alloc_id();
        let cma = CmaHeader { src_port: p.src_port, src: self.cfg.local_ip, dst: p.dest_ip };
        let private_data = req_private_data(&cma, &p.private_data)?;
        let mut req = Req::roce_defaults(RoceReqParams {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qpn: p.qpn,
            starting_psn: p.start_psn,
            local_ip: self.cfg.local_ip,
            remote_ip: p.dest_ip,
            path_mtu: p.path_mtu,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: true,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            private_data,
        });
        req.remote_cm_response_timeout = self.cfg.cm_response_timeout;
        req.local_cm_response_timeout = self.cfg.cm_response_timeout;
        req.max_cm_retries = self.cfg.max_cm_retries;
        req.primary_path.local_gid = self.cfg.local.gid;
        req.primary_path.remote_gid = p.dest.gid;
        req.primary_path.local_ack_timeout = p.local_ack_timeout;
        let tid = cm_tid(self.tid_hi, id);
        let mad = CmMad::new(tid, CmMessage::Req(req)).encode()?;
        let timeout = self.cfg.req_timeout();
        let conn = Conn {
            state: ConnState::ReqSent,
            peer: p.dest,
            tid,
            remote_comm_id: 0,
            remote_ca_guid: 0,
            local_qpn: p.qpn,
            remote_qpn: 0,
            base_timeout: timeout,
            cur_timeout: timeout,
            max_retries: self.cfg.max_cm_retries,
            retries_left: self.cfg.max_cm_retries,
            ack_timeout: p.local_ack_timeout,
            outstanding: Some(mad),
            rtu: None,
            timer: None,
            remote_id_key: false,
            remote_qpn_key: false,
        };
        self.conns.insert(id, conn);
        self.push_tx(p.dest, mad);
        self.arm(id, now + timeout);
        Ok(ConnId(id))
    }

    /// Passive: accepts a [`CmEvent::ConnectRequest`] with a REP (at most 196 bytes of private
    /// data) and arms the REP timer. The QP should already be in RTS. Next:
    /// [`CmEvent::Established`] (RTU, or [`Cm::notify_comm_est`]) or a failure event.
    pub fn accept(
        &mut self,
        now: Instant,
        id: ConnId,
        qpn: u32,
        start_psn: u32,
        rnr_retry_count: u8,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        check_len(private_data, REP_PRIVATE_DATA_LEN)?;
        let c = self.conn(id)?;
        if c.state != ConnState::ReqRcvd {
            return Err(CmError::InvalidState { id, state: c.state, op: "accept" });
        }
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: 0,
            local_qpn: qpn,
            local_eecn: 0,
            starting_psn: start_psn,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: FailoverAccepted::Accepted,
            end_to_end_flow_control: true,
            rnr_retry_count,
            srq: false,
            local_ca_guid: self.cfg.ca_guid,
            private_data: padded(private_data),
        };
        let (peer, tid, timeout) = (c.peer, c.tid, c.base_timeout);
        let mad = CmMad::new(tid, CmMessage::Rep(rep)).encode()?;
        self.set_state(id.0, ConnState::RepSent);
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.local_qpn = qpn;
            c.outstanding = Some(mad);
            c.retries_left = c.max_retries;
            c.cur_timeout = timeout;
        }
        self.push_tx(peer, mad);
        self.arm(id.0, now + timeout);
        Ok(())
    }

    /// Rejects with a REJ carrying `reason` and up to 148 bytes of private data (use
    /// [`RejReason::ConsumerDefined`] for consumer data, as `rdma_reject` does). Possible on the
    /// passive side before or after accepting (until established), and on the active side after
    /// [`CmEvent::Reply`]. The id is forgotten (passive after accepting: after TIMEWAIT); no
    /// event follows. To abandon an attempt still waiting for its REP use [`Cm::destroy`]: its
    /// REJ 4 is the one a Linux peer can match before it knows our comm ID.
    pub fn reject(
        &mut self,
        now: Instant,
        id: ConnId,
        reason: RejReason,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        check_len(private_data, REJ_PRIVATE_DATA_LEN)?;
        let c = self.conn(id)?;
        let (local, msg, timewait) = match c.state {
            ConnState::ReqRcvd => (0, MessageRejected::Req, false),
            ConnState::RepSent | ConnState::MraRepRcvd => (id.0, MessageRejected::Other, true),
            ConnState::RepRcvd => (id.0, MessageRejected::Rep, false),
            state => return Err(CmError::InvalidState { id, state, op: "reject" }),
        };
        let mut r = rej(local, c.remote_comm_id, msg, reason);
        r.private_data = padded(private_data);
        let (peer, tid) = (c.peer, c.tid);
        let mad = CmMad::new(tid, CmMessage::Rej(r)).encode()?;
        self.push_tx(peer, mad);
        if timewait {
            self.enter_timewait(now, id.0);
        } else {
            self.free(id.0);
        }
        Ok(())
    }

    /// Active: after [`CmEvent::Reply`] and moving the QP to RTR/RTS, sends the RTU. The id is
    /// then established and [`CmEvent::Established`] is queued.
    pub fn complete_connect(&mut self, now: Instant, id: ConnId) -> Result<(), CmError> {
        let _ = now;
        let c = self.conn(id)?;
        if c.state != ConnState::RepRcvd {
            return Err(CmError::InvalidState { id, state: c.state, op: "complete_connect" });
        }
        let rtu = Rtu { local_comm_id: id.0, remote_comm_id: c.remote_comm_id, ..Rtu::default() };
        let (peer, tid) = (c.peer, c.tid);
        let mad = CmMad::new(tid, CmMessage::Rtu(rtu)).encode()?;
        self.push_tx(peer, mad);
        self.set_state(id.0, ConnState::Established);
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.rtu = Some(mad);
        }
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// Passive: the QP received its first packet (IB `COMM_EST`, `rdma_notify`). In REP_SENT
    /// this stands for the RTU: the REP timer stops and [`CmEvent::Established`] is queued; a
    /// later RTU is a duplicate. Anywhere else (already established, unknown id) it does
    /// nothing.
    pub fn notify_comm_est(&mut self, now: Instant, id: ConnId) {
        let _ = now;
        let due = self
            .conns
            .get(&id.0)
            .is_some_and(|c| matches!(c.state, ConnState::RepSent | ConnState::MraRepRcvd));
        if due {
            self.establish_passive(id.0);
        }
    }

    /// Starts a disconnect: sends a DREQ and arms its timer. Next: [`CmEvent::Disconnected`].
    /// Calling it again, or after the peer's DREQ, does nothing. Before the connection is
    /// established use [`Cm::reject`] or [`Cm::destroy`] instead ([`CmError::InvalidState`]).
    pub fn disconnect(&mut self, now: Instant, id: ConnId) -> Result<(), CmError> {
        match self.conn(id)?.state {
            ConnState::Established => {
                self.send_dreq(now, id.0, true);
                Ok(())
            }
            ConnState::DreqSent | ConnState::Timewait => Ok(()),
            state => Err(CmError::InvalidState { id, state, op: "disconnect" }),
        }
    }

    /// Forgets `id` at once, telling the peer as Linux's `ib_destroy_cm_id` does: REJ 4
    /// (timeout, ARI = our CA GUID) in REQ_SENT, REJ 28 in the other states before
    /// establishment, one DREQ (not retransmitted) when established, nothing in DREQ_SENT or
    /// TIMEWAIT. Events still queued for the id are discarded and no event follows. Unknown ids
    /// are ignored.
    pub fn destroy(&mut self, now: Instant, id: ConnId) {
        let Some(c) = self.conns.get(&id.0) else {
            return;
        };
        let (peer, tid, remote, state) = (c.peer, c.tid, c.remote_comm_id, c.state);
        let farewell = match state {
            ConnState::ReqSent | ConnState::MraReqRcvd => {
                let mut r = rej(id.0, remote, MessageRejected::Other, RejReason::Timeout);
                r.reject_info_length = 8;
                r.ari = padded(&self.cfg.ca_guid.to_be_bytes());
                Some(r)
            }
            ConnState::ReqRcvd => Some(rej(0, remote, MessageRejected::Req, RejReason::ConsumerDefined)),
            ConnState::RepSent | ConnState::MraRepRcvd => {
                Some(rej(id.0, remote, MessageRejected::Other, RejReason::ConsumerDefined))
            }
            ConnState::RepRcvd => Some(rej(id.0, remote, MessageRejected::Rep, RejReason::ConsumerDefined)),
            ConnState::Established => {
                self.send_dreq(now, id.0, false);
                None
            }
            ConnState::DreqSent | ConnState::Timewait => None,
        };
        if let Some(r) = farewell {
            self.send(peer, tid, CmMessage::Rej(r));
        }
        self.free(id.0);
        self.events.retain(|e| e.id() != id);
    }

    /// Feeds one MAD received on the port (any bytes: anything that is not a CM MAD this CM
    /// handles, or that matches no id in a state where it means something, is counted in
    /// [`CmStats`] and dropped). Then drain [`Cm::poll_transmit`] and [`Cm::poll_event`].
    pub fn handle_mad(&mut self, now: Instant, from: PortAddr, mad: &[u8]) {
        let m = match CmMad::decode(mad) {
            Ok(m) => m,
            Err(MadError::Unsupported(_)) => {
                self.stats.unsupported += 1;
                return;
            }
            Err(_) => {
                self.stats.undecodable += 1;
                return;
            }
        };
        self.stats.received.bump(m.msg.attr_id());
        let tid = m.tid;
        match m.msg {
            CmMessage::Req(r) => self.on_req(now, from, tid, &r),
            CmMessage::Rep(r) => self.on_rep(now, from, tid, &r),
            CmMessage::Rtu(r) => self.on_rtu(&r),
            CmMessage::Rej(r) => self.on_rej(now, &r),
            CmMessage::Mra(r) => self.on_mra(now, &r),
            CmMessage::Dreq(r) => self.on_dreq(now, from, tid, &r),
            CmMessage::Drep(r) => self.on_drep(now, &r),
        }
    }

    /// Runs every timer due at `now`: retransmissions, give-ups, TIMEWAIT ends. Calls before
    /// [`Cm::poll_timeout`]'s deadline do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some((&(deadline, seq), &id)) = self.timers.first_key_value() {
            if deadline > now {
                break;
            }
            self.timers.remove(&(deadline, seq));
            if let Some(c) = self.conns.get_mut(&id) {
                if c.timer != Some((deadline, seq)) {
                    continue;
                }
                c.timer = None;
            }
            self.on_timer(now, id);
        }
    }

    /// The earliest deadline at which [`Cm::handle_timeout`] has work, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first_key_value().map(|(&(deadline, _), _)| deadline)
    }

    /// The next MAD to send, with its destination, oldest first.
    pub fn poll_transmit(&mut self) -> Option<(PortAddr, Mad)> {
        self.tx.pop_front()
    }

    /// The next event for the user, oldest first.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// Ids held, TIMEWAIT included (0 once every connection has wound down).
    pub fn live(&self) -> usize {
        self.conns.len()
    }

    /// Connection requests received and not yet accepted or rejected.
    pub fn pending_requests(&self) -> usize {
        self.pending_requests
    }

    /// The CM state of `id`, `None` if it is not held.
    pub fn state(&self, id: ConnId) -> Option<ConnState> {
        self.conns.get(&id.0).map(|c| c.state)
    }

    // ---- helpers ----

    /// The id `local` if its peer's comm ID is `remote` (Linux `cm_acquire_id`).
    fn matched(&self, local: u32, remote: u32) -> Option<&Conn> {
        self.conns.get(&local).filter(|c| c.remote_comm_id == remote)
    }

    fn conn(&self, id: ConnId) -> Result<&Conn, CmError> {
        self.conns.get(&id.0).ok_or(CmError::UnknownId(id))
    }

    /// A fresh comm ID: random, nonzero, not held, in this CM's partition.
    fn alloc_id(&mut self) -> u32 {
        let (index, count) = self.cfg.id_partition;
        let count = count.max(1);
        loop {
            let r = self.rng.next_u32();
            let Some(id) = (r - r % count).checked_add(index % count) else { continue };
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn set_state(&mut self, lid: u32, state: ConnState) {
        if let Some(c) = self.conns.get_mut(&lid) {
            if c.state == ConnState::ReqRcvd && state != ConnState::ReqRcvd {
                self.pending_requests = self.pending_requests.saturating_sub(1);
            }
            c.state = state;
        }
    }

    fn arm(&mut self, lid: u32, deadline: Instant) {
        self.disarm(lid);
        if let Some(c) = self.conns.get_mut(&lid) {
            self.timer_seq += 1;
            let key = (deadline, self.timer_seq);
            c.timer = Some(key);
            self.timers.insert(key, lid);
        }
    }

    fn disarm(&mut self, lid: u32) {
        if let Some(key) = self.conns.get_mut(&lid).and_then(|c| c.timer.take()) {
            self.timers.remove(&key);
        }
    }

    fn establish_passive(&mut self, lid: u32) {
        self.disarm(lid);
        self.set_state(lid, ConnState::Established);
        if let Some(c) = self.conns.get_mut(&lid) {
            c.outstanding = None;
        }
        self.events.push_back(CmEvent::Established { id: ConnId(lid) });
    }

    /// Sends a DREQ for an established id; `retransmit` arms the DREQ timer (else the id is
    /// about to be freed).
    fn send_dreq(&mut self, now: Instant, lid: u32, retransmit: bool) {
        let Some(c) = self.conns.get(&lid) else {
            return;
        };
        let dreq = Dreq {
            local_comm_id: lid,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            ..Dreq::default()
        };
        let peer = c.peer;
        let Some(mad) = self.send(peer, cm_tid(self.tid_hi, lid), CmMessage::Dreq(dreq)) else {
            return;
        };
        if !retransmit {
            return;
        }
        self.set_state(lid, ConnState::DreqSent);
        if let Some(c) = self.conns.get_mut(&lid) {
            c.outstanding = Some(mad);
            c.retries_left = c.max_retries;
            c.cur_timeout = c.base_timeout;
            let deadline = now + c.base_timeout;
            self.arm(lid, deadline);
        }
    }

    /// TIMEWAIT: timer stopped, QPN key dropped (comm ID key kept), forgotten after
    /// [`CmConfig::timewait`].
    fn enter_timewait(&mut self, now: Instant, lid: u32) {
        self.set_state(lid, ConnState::Timewait);
        let Some(c) = self.conns.get_mut(&lid) else {
            return;
        };
        c.outstanding = None;
        if c.remote_qpn_key {
            c.remote_qpn_key = false;
            let key = (c.remote_qpn, c.remote_ca_guid);
            if self.by_remote_qpn.get(&key) == Some(&lid) {
                self.by_remote_qpn.remove(&key);
            }
        }
        let deadline = now + self.cfg.timewait;
        self.arm(lid, deadline);
    }

    /// Forgets an id: its timer, its keys, its pending-request slot.
    fn free(&mut self, lid: u32) {
        self.disarm(lid);
        let Some(c) = self.conns.remove(&lid) else {
            return;
        };
        if c.state == ConnState::ReqRcvd {
            self.pending_requests = self.pending_requests.saturating_sub(1);
        }
        if c.remote_id_key {
            let key = (c.remote_comm_id, c.remote_ca_guid);
            if self.by_remote_id.get(&key) == Some(&lid) {
                self.by_remote_id.remove(&key);
            }
        }
        if c.remote_qpn_key {
            let key = (c.remote_qpn, c.remote_ca_guid);
            if self.by_remote_qpn.get(&key) == Some(&lid) {
                self.by_remote_qpn.remove(&key);
            }
        }
    }

    /// Encodes and queues a message; the bytes are returned for retransmission. Encoding
    /// failures (impossible for the values this module builds) are counted, never panics.
    fn send(&mut self, to: PortAddr, tid: u64, msg: CmMessage) -> Option<Mad> {
        match CmMad::new(tid, msg).encode() {
            Ok(mad) => {
                self.push_tx(to, mad);
                Some(mad)
            }
            Err(_) => {
                self.stats.encode_errors += 1;
                None
            }
        }
    }

    fn push_tx(&mut self, to: PortAddr, mad: Mad) {
        if self.tx.len() >= TRANSMIT_QUEUE_LIMIT {
            self.stats.transmit_overflow += 1;
            return;
        }
        if let Some(attr_id) = mad.get(16..18).and_then(|b| b.first_chunk::<2>()) {
            self.stats.sent.bump(u16::from_be_bytes(*attr_id));
        }
        self.tx.push_back((to, mad));
    }
}

fn check_len(data: &[u8], max: usize) -> Result<(), CmError> {
    if data.len() > max { Err(CmError::PrivateDataTooLong { len: data.len(), max }) } else { Ok(()) }
}

#[cfg(test)]
mod tests;
