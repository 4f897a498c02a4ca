//! The RC transport of one queue pair, as a sans-IO state machine.
//!
//! `RcQp` is what an HCA's QP context and its requester/responder pipelines do, fed with
//! parsed packets and `now`, asked for frames to transmit, and drained of work completions and
//! async events. The device around it ([`super::SoftDevice`]) owns sockets, the lock and the
//! CQs; nothing here does IO or reads a clock.
//!
//! Behaviour follows IBTA RC (and rxe where the spec leaves room):
//! * **Requester**: messages are cut into packets of the path MTU with 24-bit PSNs assigned at
//!   post time; at most `max_inflight` packets are unacknowledged; AckReq is set on the last
//!   packet of each message and every `ACK_REQ_INTERVAL` packets. ACKs are cumulative. A NAK
//!   for a PSN sequence error, or the retransmission timer (4.096 µs × 2^timeout) firing, sends
//!   everything again from the oldest unacknowledged PSN (go-back-N), spending one of
//!   `retry_cnt` retries; the counter resets whenever an ACK makes progress. Retries exhausted
//!   → `RETRY_EXC_ERR`. An RNR NAK pauses for the peer's timer and spends one of `rnr_retry`
//!   (7 = forever) → `RNR_RETRY_EXC_ERR`. Completions are generated in posting order.
//! * **Responder**: packets are accepted only at the expected PSN. Earlier PSNs are duplicates:
//!   re-acknowledged, never delivered twice. Later PSNs are a gap: one sequence NAK per gap.
//!   SENDs consume posted receives (none → RNR NAK; too long → `LOC_LEN_ERR` here and
//!   `REM_INV_REQ_ERR` there). RDMA WRITEs are checked against the MR table (key, PD,
//!   REMOTE_WRITE, whole range) on their first packet, before a byte lands; a failure NAKs with
//!   a remote access error and both QPs go to ERR. The first valid packet in RTR raises
//!   `COMM_EST`. ACKs are coalesced until the device asks for frames: the positive ones queued
//!   by then leave as one (the last), riding as a [`PiggyAck`] on a request packet of this
//!   QP's requester if one leaves in that call, else in an ACK frame; NAKs go in order, in
//!   frames of their own. A [`PiggyAck`] received is handled like an ACK frame before the
//!   request carrying it.
//! * **Same host** ([`super::place`]): when the device gave the QP a placement nonce at RTR, a
//!   WRITE with data leaves as one placement request taking the WRITE's PSNs; it counts as one
//!   packet against `max_inflight`. The responder executes it in PSN order like a WRITE's
//!   first packet (same checks, same NAKs) and then copies; a `PlacementRefused` NAK rewinds to
//!   its PSN without spending a retry, and the QP sends by the wire from then on.
//! * **Errors**: any error moves the QP to ERR; every outstanding work request then completes
//!   with `WR_FLUSH_ERR` (unsignaled ones included), in order.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::live::LiveWord;
use super::mem::MrTable;
use super::packet::{
    self, Aeth, Bth, Headers, NakCode, Opcode, Packet, PiggyAck, Reth, Syndrome, psn_add, psn_diff,
};
use super::place::{Copied, MAX_PLACED_SGES, PlacedWrite, Placement, Placing, Unplaced};
use super::wire::Wire;
use crate::fabric::{
    Access, AsyncEvent, FabricError, FabricStats, QpCaps, QpModify, QpState, RecvWr, SendOp, SendWr, Sge, Wc,
    WcOpcode, WcStatus,
};
use crate::time::Instant;

/// AckReq is set at least every this many packets of a long message.
pub(crate) const ACK_REQ_INTERVAL: u32 = 16;

/// The AETH credit code meaning "no credit information" (what rxe sends).
const NO_CREDIT_INFO: u8 = 0x1f;

/// Responses (ACK/NAK) a responder keeps queued between transmit opportunities. Sending a few
/// per batch rather than one coalesced ACK means a single lost response does not cost the
/// requester a whole retransmission timeout.
const ACK_QUEUE_MAX: usize = 8;

/// Most PSNs placed WRITEs may have outstanding (2^22: half the unambiguous PSN window).
const PLACED_PSN_WINDOW: i64 = 1 << 22;
/// The most PSNs the posted send queue may span (a quarter of the 24-bit space).
const SQ_PSN_SPAN: i64 = 1 << 22;

/// What the responder needs to execute same-host placement requests ([`super::place`]).
pub(crate) struct PlaceCtx<'a> {
    pub(crate) place: &'a mut Placement,
    pub(crate) wire: &'a dyn Wire,
}

/// Which of the QP's completion queues a completion goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CqSel {
    /// The send CQ.
    Send,
    /// The receive CQ.
    Recv,
}

/// A work completion on its way to a CQ.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    pub(crate) cq: CqSel,
    pub(crate) wc: Wc,
    pub(crate) solicited: bool,
}

#[derive(Debug)]
struct SendWqe {
    wr_id: u64,
    op: SendOp,
    sges: SgeList,
    inline: Option<Vec<u8>>,
    len: u32,
    signaled: bool,
    solicited: bool,
    first_psn: u32,
    npkts: u32,
    /// Sent as one placement request, not yet acknowledged.
    placed: bool,
    /// Its liveness word once it has been sent as a placement request ([`super::live`]);
    /// cleared when the WQE leaves the queue, before its completion is pushed out.
    live: Option<LiveWord>,
}

impl SendWqe {
    fn last_psn(&self) -> u32 {
        psn_add(self.first_psn, self.npkts - 1)
    }

    /// Whether this WQE may go as a placement request (a WRITE with data, not inline).
    fn placeable(&self) -> bool {
        matches!(self.op, SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. })
            && self.inline.is_none()
            && self.len > 0
            && self.sges.len() <= MAX_PLACED_SGES
    }

    fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        }
    }
}

#[derive(Debug)]
struct RecvWqe {
    wr_id: u64,
    sges: SgeList,
    len: u64,
}

/// SGEs kept inline in a work-queue entry.
const INLINE_SGES: usize = 2;

/// A work request's scatter/gather list as its queue entry keeps it: up to [`INLINE_SGES`]
/// entries in place (most requests have one), more on the heap.
#[derive(Debug)]
enum SgeList {
    Inline { sges: [Sge; INLINE_SGES], n: u8 },
    Heap(Vec<Sge>),
}

impl SgeList {
    fn new(sges: &[Sge]) -> SgeList {
        let mut inline = [Sge::default(); INLINE_SGES];
        match inline.get_mut(..sges.len()) {
            Some(dst) => {
                dst.copy_from_slice(sges);
                SgeList::Inline { sges: inline, n: sges.len() as u8 }
            }
            None => SgeList::Heap(sges.to_vec()),
        }
    }
}

impl std::ops::Deref for SgeList {
    type Target = [Sge];

    fn deref(&self) -> &[Sge] {
        match self {
            SgeList::Inline { sges, n } => sges.get(..usize::from(*n)).unwrap_or_default(),
            SgeList::Heap(v) => v,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PendingAck {
    /// Cumulative ACK up to and including `psn`.
    Ack { psn: u32 },
    /// Sequence or error NAK at `psn`.
    Nak { psn: u32, code: NakCode },
    /// RNR NAK at `psn`.
    Rnr { psn: u32 },
}

#[derive(Clone, Copy, Debug)]
enum InMsg {
    Send { offset: u64 },
    Write { rkey: u32, va: u64, remaining: u64, total: u32 },
}

/// Why an in-sequence request packet was not accepted.
enum Refusal {
    Rnr,
    Nak(NakCode),
    /// A placement request this responder cannot execute: the requester uses the wire.
    Unplaceable,
    /// A placement request that was no longer outstanding at the requester when it was
    /// executed: dropped like a lost packet (no ACK, expected PSN unmoved).
    Stale,
    /// A placement request whose copy runs on the copy engine: nothing moves (expected PSN,
    /// ACK, completion) until [`RcQp::conclude_placed`].
    Running,
}

impl From<Unplaced> for Refusal {
    fn from(e: Unplaced) -> Refusal {
        match e {
            Unplaced::Refused => Refusal::Unplaceable,
            Unplaced::Access => Refusal::Nak(NakCode::RemoteAccessError),
            Unplaced::Fault => Refusal::Nak(NakCode::RemoteOperationalError),
            Unplaced::Stale => Refusal::Stale,
        }
    }
}

/// A placement request whose copy is running: what accepting it takes once the copy ends.
#[derive(Clone, Copy, Debug)]
struct PlacedTail {
    bth: Bth,
    dma_len: u32,
    imm: Option<u32>,
    psn_count: u32,
}

/// One RC queue pair's transport state.
#[derive(Debug)]
pub(crate) struct RcQp {
    qpn: u32,
    pd: u32,
    state: QpState,
    caps: QpCaps,
    sq_sig_all: bool,
    qp_access: Access,
    mtu: u32,
    dest_qpn: u32,
    dest_ip: Option<Ipv4Addr>,
    ack_timeout: Option<Duration>,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    max_inflight: u32,

    // Requester.
    sq: VecDeque<SendWqe>,
    sq_next_psn: u32,
    send_psn: u32,
    send_idx: usize,
    send_pkt: u32,
    sent_end: u32,
    una: u32,
    retries_left: u8,
    rnr_left: u8,
    retx_timer: Option<Instant>,
    rnr_until: Option<Instant>,
    /// The nonce for placement requests, when the peer is on the same host.
    place_nonce: Option<u64>,
    /// The peer refused a placement request: never place again on this QP.
    place_refused: bool,
    /// PSNs of placed WQEs in flight beyond their first (they cost no wire packets).
    placed_extra: i64,

    // Responder.
    rq: VecDeque<RecvWqe>,
    epsn: u32,
    msn: u32,
    in_msg: Option<InMsg>,
    /// The placement request whose copy runs ([`super::copier`]); while it does, the device
    /// gives this QP no packet.
    placing: Option<PlacedTail>,
    acks: VecDeque<PendingAck>,
    /// Something queued in `acks` should not wait for a reply to carry it (see
    /// [`RcQp::must_respond_now`]); cleared when `acks` empties.
    acks_urgent: bool,
    nak_sent: bool,
    comm_est_raised: bool,

    completions: Vec<Completion>,
    events: Vec<AsyncEvent>,
}

/// A frame `poll_transmit` wrote: its length and where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TxFrame {
    pub(crate) len: usize,
    pub(crate) dst: Ipv4Addr,
}

impl RcQp {
    pub(crate) fn new(qpn: u32, pd: u32, caps: QpCaps, sq_sig_all: bool, max_inflight: u32) -> RcQp {
        RcQp {
            qpn,
            pd,
            state: QpState::Reset,
            caps,
            sq_sig_all,
            qp_access: Access::NONE,
            mtu: 4096,
            dest_qpn: 0,
            dest_ip: None,
            ack_timeout: None,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 0,
            max_inflight: max_inflight.clamp(1, 1 << 22),
            sq: VecDeque::new(),
            sq_next_psn: 0,
            send_psn: 0,
            send_idx: 0,
            send_pkt: 0,
            sent_end: 0,
            una: 0,
            retries_left: 7,
            rnr_left: 7,
            retx_timer: None,
            rnr_until: None,
            place_nonce: None,
            place_refused: false,
            placed_extra: 0,
            rq: VecDeque::new(),
            epsn: 0,
            msn: 0,
            in_msg: None,
            placing: None,
            acks: VecDeque::new(),
            acks_urgent: false,
            nak_sent: false,
            comm_est_raised: false,
            completions: Vec::new(),
            events: Vec::new(),
        }
    }

    pub(crate) fn state(&self) -> QpState {
        self.state
    }

    /// The peer's address once the QP is in RTR.
    pub(crate) fn dest_ip(&self) -> Option<Ipv4Addr> {
        self.dest_ip
    }

    /// Places WRITEs with requests carrying `nonce` (`None`: the wire only).
    pub(crate) fn set_place(&mut self, nonce: Option<u64>) {
        self.place_nonce = nonce;
    }

    /// Whether the peer refused a placement request.
    pub(crate) fn place_refused(&self) -> bool {
        self.place_refused
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(&mut self, m: &QpModify) -> Result<(), FabricError> {
        let invalid = FabricError::InvalidTransition { from: self.state, to: m.target() };
        match (*m, self.state) {
            (QpModify::Reset, _) => {
                self.reset();
                Ok(())
            }
            // Linux's state table (`qp_state_table` in the kernel's verbs.c) has no RESET → ERR:
            // a QP that never left RESET has nothing to flush, and the kernel says EINVAL.
            (QpModify::Err, QpState::Reset) => Err(invalid),
            (QpModify::Err, _) => {
                self.enter_error();
                Ok(())
            }
            // The port number is checked by the device, which knows its port.
            (QpModify::Init { access, .. }, QpState::Reset | QpState::Init) => {
                self.qp_access = access;
                self.state = QpState::Init;
                Ok(())
            }
            (QpModify::Rtr { path_mtu, dest_qpn, rq_psn, dest, min_rnr_timer, .. }, QpState::Init) => {
                let ip = dest
                    .gid
                    .to_ipv4()
                    .ok_or(FabricError::InvalidArgument { what: "dest GID (not IPv4-mapped)" })?;
                if !(2..=packet::PSN_MASK).contains(&dest_qpn) {
                    return Err(FabricError::InvalidArgument { what: "dest_qpn" });
                }
                if rq_psn > packet::PSN_MASK {
                    return Err(FabricError::InvalidArgument { what: "rq_psn" });
                }
                if min_rnr_timer > 31 {
                    return Err(FabricError::InvalidArgument { what: "min_rnr_timer" });
                }
                self.mtu = path_mtu.bytes();
                self.dest_qpn = dest_qpn;
                self.dest_ip = Some(ip);
                self.epsn = rq_psn;
                self.min_rnr_timer = min_rnr_timer;
                self.state = QpState::Rtr;
                Ok(())
            }
            (QpModify::Rts { sq_psn, timeout, retry_cnt, rnr_retry, .. }, QpState::Rtr | QpState::Rts) => {
                if sq_psn > packet::PSN_MASK {
                    return Err(FabricError::InvalidArgument { what: "sq_psn" });
                }
                if retry_cnt > 7 || rnr_retry > 7 || timeout > 31 {
                    return Err(FabricError::InvalidArgument { what: "timeout/retry_cnt/rnr_retry" });
                }
                if self.state == QpState::Rtr {
                    self.sq_next_psn = sq_psn;
                    self.send_psn = sq_psn;
                    self.sent_end = sq_psn;
                    self.una = sq_psn;
                }
                self.ack_timeout = packet::ack_timeout_duration(timeout);
                self.retry_cnt = retry_cnt;
                self.rnr_retry = rnr_retry;
                self.retries_left = retry_cnt;
                self.rnr_left = rnr_retry;
                self.state = QpState::Rts;
                Ok(())
            }
            _ => Err(invalid),
        }
    }

    fn reset(&mut self) {
        let (qpn, pd, caps, sig, inflight) =
            (self.qpn, self.pd, self.caps, self.sq_sig_all, self.max_inflight);
        *self = RcQp::new(qpn, pd, caps, sig, inflight);
    }

    /// Moves to ERR and flushes every outstanding work request, in order.
    pub(crate) fn enter_error(&mut self) {
        self.state = QpState::Err;
        self.placing = None;
        for w in self.sq.drain(..) {
            self.completions.push(Completion {
                cq: CqSel::Send,
                wc: Wc {
                    wr_id: w.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: w.wc_opcode(),
                    qp_num: self.qpn,
                    ..Wc::default()
                },
                solicited: false,
            });
        }
        for r in self.rq.drain(..) {
            self.completions.push(Completion {
                cq: CqSel::Recv,
                wc: Wc {
                    wr_id: r.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: self.qpn,
                    ..Wc::default()
                },
                solicited: false,
            });
        }
        self.send_idx = 0;
        self.send_pkt = 0;
        self.placed_extra = 0;
        self.in_msg = None;
        self.retx_timer = None;
        self.rnr_until = None;
    }

    fn flush_completion(&mut self, cq: CqSel, wr_id: u64, opcode: WcOpcode) {
        self.completions.push(Completion {
            cq,
            wc: Wc { wr_id, status: WcStatus::WrFlushErr, opcode, qp_num: self.qpn, ..Wc::default() },
            solicited: false,
        });
    }

    /// Queues one send work request (the device validates the batch around it).
    pub(crate) fn post_send(&mut self, wr: &SendWr<'_>, mem: &MrTable) -> Result<(), &'static str> {
        if self.state == QpState::Err {
            let opcode = match wr.op {
                SendOp::Send | SendOp::SendWithImm { .. } => WcOpcode::Send,
                _ => WcOpcode::RdmaWrite,
            };
            self.flush_completion(CqSel::Send, wr.wr_id, opcode);
            return Ok(());
        }
        if self.state != QpState::Rts {
            return Err("QP is not in RTS");
        }
        if self.sq.len() >= self.caps.max_send_wr as usize {
            return Err("send queue full");
        }
        if wr.sg_list.len() > self.caps.max_send_sge as usize && !wr.flags.inline {
            return Err("too many scatter/gather entries");
        }
        let mut len: u64 = 0;
        for sge in wr.sg_list {
            len += u64::from(sge.length);
        }
        if len > 1 << 31 {
            return Err("message longer than 2 GiB");
        }
        let len = len as u32;
        let inline = if wr.flags.inline {
            if len > self.caps.max_inline_data {
                return Err("inline data longer than max_inline_data");
            }
            let mut data = vec![0u8; len as usize];
            let mut at = 0usize;
            for sge in wr.sg_list {
                let n = sge.length as usize;
                let dst = data.get_mut(at..at + n).ok_or("inline gather")?;
                mem.read(self.pd, sge.lkey, sge.addr, dst)
                    .map_err(|_| "inline data is not in a registered region")?;
                at += n;
            }
            Some(data)
        } else {
            None
        };
        let npkts = len.div_ceil(self.mtu).max(1);
        // PSNs are assigned here, at post time: the send queue may not span more than
        // SQ_PSN_SPAN, or PSN comparisons (which see half the 24-bit space) would wrap and
        // take an unsent WQE for acknowledged. rxe assigns them at first transmission instead.
        let oldest = self.sq.front().map_or(self.sq_next_psn, |w| w.first_psn);
        let span = i64::from(psn_diff(self.sq_next_psn, oldest)) + i64::from(npkts);
        if span > SQ_PSN_SPAN {
            return Err(
                "send queue would span more than 2^22 packets (16 GiB at MTU 4096, 1 GiB at MTU 256)",
            );
        }
        let first_psn = self.sq_next_psn;
        self.sq_next_psn = psn_add(self.sq_next_psn, npkts);
        self.sq.push_back(SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            sges: SgeList::new(if inline.is_some() { &[] } else { wr.sg_list }),
            inline,
            len,
            signaled: wr.flags.signaled || self.sq_sig_all,
            solicited: wr.flags.solicited,
            first_psn,
            npkts,
            placed: false,
            live: None,
        });
        Ok(())
    }

    /// Queues one receive work request.
    pub(crate) fn post_recv(&mut self, wr: &RecvWr<'_>) -> Result<(), &'static str> {
        match self.state {
            QpState::Reset => return Err("QP is in RESET"),
            QpState::Err => {
                self.flush_completion(CqSel::Recv, wr.wr_id, WcOpcode::Recv);
                return Ok(());
            }
            _ => {}
        }
        if self.rq.len() >= self.caps.max_recv_wr as usize {
            return Err("receive queue full");
        }
        if wr.sg_list.len() > self.caps.max_recv_sge as usize {
            return Err("too many scatter/gather entries");
        }
        let len = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
        self.rq.push_back(RecvWqe { wr_id: wr.wr_id, sges: SgeList::new(wr.sg_list), len });
        Ok(())
    }

    /// Whether completions wait to be taken.
    pub(crate) fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Takes the completions produced so far.
    ///
    /// Receive completions come before send completions made in the same call: a request
    /// that carried a piggybacked ACK is the peer waiting for an answer, while the sends that
    /// ACK completed only free resources. IBTA orders completions within a work queue, never
    /// across the two, and each queue keeps its order here.
    pub(crate) fn take_completions(&mut self, out: &mut Vec<Completion>) {
        if self.completions.len() > 1 && self.completions.first().is_some_and(|c| c.cq == CqSel::Send) {
            self.completions.sort_by_key(|c| c.cq == CqSel::Send);
        }
        out.append(&mut self.completions);
    }

    /// Takes the async events produced so far.
    pub(crate) fn take_events(&mut self, out: &mut Vec<AsyncEvent>) {
        out.append(&mut self.events);
    }

    /// The earliest timer (retransmission or end of an RNR pause).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        Instant::min_deadline(self.retx_timer, self.rnr_until)
    }

    /// Whether `poll_transmit` would produce a frame at `now`.
    pub(crate) fn wants_transmit(&self, now: Instant) -> bool {
        (!self.acks.is_empty() && self.dest_ip.is_some()) || self.request_ready(now)
    }

    /// Whether a request packet may leave at `now`.
    fn request_ready(&self, now: Instant) -> bool {
        self.state == QpState::Rts
            && self.rnr_until.is_none_or(|t| now >= t)
            && self.send_psn != self.sq_next_psn
            && self.window_open()
    }

    /// Whether every response queued is a positive ACK, so one [`PiggyAck`] may carry them.
    fn only_positive_acks(&self) -> bool {
        !self.acks.is_empty() && self.acks.iter().all(|a| matches!(a, PendingAck::Ack { .. }))
    }

    /// The ACK the next request packet may carry: the last of the queued positive ACKs, which
    /// covers the others (they are cumulative and queued in PSN order).
    fn piggy(&self) -> Option<PiggyAck> {
        if !self.only_positive_acks() {
            return None;
        }
        match self.acks.back() {
            Some(PendingAck::Ack { psn }) => Some(PiggyAck { psn: *psn, msn: self.msn }),
            _ => None,
        }
    }

    /// The next response for an ACK frame of its own; queued positive ACKs leave as one, the
    /// last (they are cumulative).
    fn next_standalone_ack(&mut self) -> Option<PendingAck> {
        if self.only_positive_acks() {
            let last = self.acks.pop_back();
            self.acks.clear();
            self.acks_urgent = false;
            return last;
        }
        let next = self.acks.pop_front();
        self.acks_urgent &= !self.acks.is_empty();
        next
    }

    /// Whether the responses queued must leave in this `progress` call rather than wait for
    /// the next (a device `progress_receive`). Only a positive ACK of one SEND may wait: a
    /// request whose answer, posted by the caller before the next call, carries it (a ping,
    /// a PUT_REQ and its PUT_ACK). NAKs, re-ACKs of duplicates and ACKs of RDMA WRITEs leave
    /// now: a requester's WRITE is a bulk transfer whose completion it waits for before it
    /// answers (LNet's bulk, then the reply), so no reply is coming to carry the ACK. So do
    /// the ACKs of several SENDs: a stream (many RPCs in flight) is paced by its
    /// completions, and holding them measured slower (brw 64K with 8 in flight).
    pub(crate) fn must_respond_now(&self) -> bool {
        self.acks_urgent || self.acks.len() > 1 || (!self.acks.is_empty() && !self.only_positive_acks())
    }

    /// A request packet carrying `piggy` was written: those ACKs are sent.
    fn piggy_sent(&mut self, piggy: Option<PiggyAck>, stats: &mut FabricStats) {
        if piggy.is_some() {
            self.acks.clear();
            self.acks_urgent = false;
            stats.acks_piggybacked += 1;
        }
    }

    /// Whether the next packet fits the window: `max_inflight` wire packets, where a placement
    /// request in flight counts as one, and placed PSNs within [`PLACED_PSN_WINDOW`].
    fn window_open(&self) -> bool {
        let outstanding = i64::from(psn_diff(self.send_psn, self.una));
        outstanding - self.placed_extra < i64::from(self.max_inflight) && outstanding < PLACED_PSN_WINDOW
    }

    /// Whether the next packet would be a placement request.
    fn next_is_placed(&self) -> Option<u64> {
        let nonce = self.place_nonce.filter(|_| !self.place_refused)?;
        (self.send_pkt == 0 && self.sq.get(self.send_idx)?.placeable()).then_some(nonce)
    }

    // ---------------------------------------------------------------- inbound

    /// Handles one parsed packet addressed to this QP from `src`.
    pub(crate) fn on_packet(
        &mut self,
        now: Instant,
        src: Ipv4Addr,
        pkt: &Packet<'_>,
        mem: &MrTable,
        stats: &mut FabricStats,
        place: &mut PlaceCtx<'_>,
    ) {
        match self.state {
            QpState::Rtr | QpState::Rts => {}
            _ => return,
        }
        if Some(src) != self.dest_ip {
            stats.malformed += 1;
            return;
        }
        if let Some(p) = pkt.headers.piggy {
            // The requester half of this QP learns what its peer accepted, whatever becomes
            // of the request carrying it.
            if self.state == QpState::Rts {
                self.on_positive_ack(now, p.psn);
            }
        }
        let op = pkt.headers.bth.opcode;
        if op == Opcode::RcAck {
            if self.state == QpState::Rts {
                self.on_ack(now, pkt, stats);
            }
            return;
        }
        if !(op.is_send() || op.is_write() || op.is_placed()) {
            stats.malformed += 1;
            return;
        }
        self.on_request(src, pkt, mem, stats, place);
    }

    /// Queues a response; when the queue is full, newer ACKs replace an ACK at its tail.
    fn queue_ack(&mut self, a: PendingAck) {
        if self.acks.len() >= ACK_QUEUE_MAX {
            if let (Some(PendingAck::Ack { psn: last }), PendingAck::Ack { psn }) = (self.acks.back_mut(), a)
            {
                *last = psn;
                return;
            }
            if matches!(a, PendingAck::Ack { .. }) {
                return;
            }
            self.acks.pop_front();
        }
        self.acks.push_back(a);
    }

    fn ack_expected(&mut self) {
        self.queue_ack(PendingAck::Ack { psn: psn_add(self.epsn, packet::PSN_MASK) });
    }

    fn on_request(
        &mut self,
        src: Ipv4Addr,
        pkt: &Packet<'_>,
        mem: &MrTable,
        stats: &mut FabricStats,
        place: &mut PlaceCtx<'_>,
    ) {
        let bth = pkt.headers.bth;
        let d = psn_diff(bth.psn, self.epsn);
        if d < 0 {
            stats.duplicates += 1;
            self.ack_expected();
            self.acks_urgent = true;
            return;
        }
        if d > 0 {
            if !self.nak_sent {
                self.nak_sent = true;
                self.queue_ack(PendingAck::Nak { psn: self.epsn, code: NakCode::PsnSequenceError });
                stats.seq_naks += 1;
            }
            return;
        }
        if self.state == QpState::Rtr && !self.comm_est_raised {
            self.comm_est_raised = true;
            self.events.push(AsyncEvent::CommEst { qp_num: self.qpn });
        }
        let op = bth.opcode;
        let result = if op.is_send() {
            self.rx_send(pkt, mem).map(|()| 1)
        } else if op.is_placed() {
            self.rx_placed(src, pkt, mem, stats, place)
        } else {
            self.rx_write(pkt, mem).map(|()| 1)
        };
        self.accept(bth, result, stats);
    }

    /// Whether a placement request's copy is running (the device holds this QP's packets).
    pub(crate) fn is_placing(&self) -> bool {
        self.placing.is_some()
    }

    /// Ends the placement request whose copy was running, as `outcome` says: accepted as
    /// [`RcQp::rx_placed`] accepts a copy it made itself, or refused. Nothing if the QP left
    /// RTR/RTS meanwhile (that dropped the request).
    pub(crate) fn conclude_placed(&mut self, outcome: Result<Copied, Unplaced>, stats: &mut FabricStats) {
        let Some(t) = self.placing.take() else { return };
        if !matches!(self.state, QpState::Rtr | QpState::Rts) {
            return;
        }
        let result = match outcome {
            Ok(copied) => {
                self.placed_landed(copied, &t, stats);
                Ok(t.psn_count)
            }
            Err(e) => Err(Refusal::from(e)),
        };
        self.accept(t.bth, result, stats);
    }

    /// Moves the responder on past request `bth` (`result`: the PSNs it took) or answers its
    /// refusal.
    fn accept(&mut self, bth: Bth, result: Result<u32, Refusal>, stats: &mut FabricStats) {
        let op = bth.opcode;
        match result {
            Ok(psns) => {
                self.epsn = psn_add(self.epsn, psns);
                self.nak_sent = false;
                if op.is_last() {
                    self.msn = (self.msn + 1) & packet::PSN_MASK;
                }
                // A sequence NAK still queued stays: the packets after the gap this one filled
                // were discarded, and only the NAK makes the requester resend them (withdrawn,
                // a reordered MIDDLE cost a retransmission timeout, or hung a QP whose timeout
                // is infinite). A NAK for a PSN already passed is harmless to the requester.
                if bth.ack_req {
                    self.ack_expected();
                    self.acks_urgent |= !op.is_send();
                }
            }
            Err(Refusal::Rnr) => {
                self.nak_sent = true;
                self.queue_ack(PendingAck::Rnr { psn: bth.psn });
                stats.rnr_naks += 1;
            }
            Err(Refusal::Unplaceable) => {
                // Like an RNR NAK: the requester resends from this PSN (on the wire); what it
                // already sent after it is out of sequence and dropped without another NAK.
                self.nak_sent = true;
                self.queue_ack(PendingAck::Nak { psn: bth.psn, code: NakCode::PlacementRefused });
                stats.placed_refused += 1;
            }
            Err(Refusal::Stale) => stats.placed_stale += 1,
            Err(Refusal::Running) => {}
            Err(Refusal::Nak(code)) => {
                if code == NakCode::RemoteAccessError {
                    stats.access_errors += 1;
                }
                self.queue_ack(PendingAck::Nak { psn: bth.psn, code });
                self.enter_error();
                self.events.push(AsyncEvent::QpFatal { qp_num: self.qpn });
            }
        }
    }

    fn complete_recv(
        &mut self,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        solicited: bool,
    ) {
        if let Some(r) = self.rq.pop_front() {
            self.completions.push(Completion {
                cq: CqSel::Recv,
                wc: Wc { wr_id: r.wr_id, status, opcode, byte_len, imm_data: imm, qp_num: self.qpn },
                solicited,
            });
        }
    }

    fn rx_send(&mut self, pkt: &Packet<'_>, mem: &MrTable) -> Result<(), Refusal> {
        let bth = pkt.headers.bth;
        let op = bth.opcode;
        let offset = if op.is_first() {
            if self.in_msg.is_some() {
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
            if self.rq.is_empty() {
                return Err(Refusal::Rnr);
            }
            0
        } else {
            match self.in_msg {
                Some(InMsg::Send { offset }) => offset,
                _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
            }
        };
        let plen = pkt.payload.len() as u64;
        if plen > u64::from(self.mtu) || (!op.is_last() && plen != u64::from(self.mtu)) {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let end = offset + plen;
        let (fits, scatter_ok) = match self.rq.front() {
            Some(r) if end <= r.len => (true, scatter(mem, self.pd, &r.sges, offset, pkt.payload)),
            Some(_) => (false, false),
            None => return Err(Refusal::Nak(NakCode::InvalidRequest)),
        };
        if !fits {
            self.complete_recv(WcStatus::LocLenErr, WcOpcode::Recv, 0, None, false);
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        if !scatter_ok {
            self.complete_recv(WcStatus::LocProtErr, WcOpcode::Recv, 0, None, false);
            return Err(Refusal::Nak(NakCode::RemoteOperationalError));
        }
        if op.is_last() {
            self.in_msg = None;
            self.complete_recv(WcStatus::Success, WcOpcode::Recv, end as u32, pkt.headers.imm, bth.solicited);
        } else {
            self.in_msg = Some(InMsg::Send { offset: end });
        }
        Ok(())
    }

    fn rx_write(&mut self, pkt: &Packet<'_>, mem: &MrTable) -> Result<(), Refusal> {
        let bth = pkt.headers.bth;
        let op = bth.opcode;
        let (rkey, va, remaining, total) = if op.is_first() {
            if self.in_msg.is_some() {
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            }
            let Some(reth) = pkt.headers.reth else {
                return Err(Refusal::Nak(NakCode::InvalidRequest));
            };
            if !self.qp_access.contains(Access::REMOTE_WRITE) {
                return Err(Refusal::Nak(NakCode::RemoteAccessError));
            }
            if reth.dma_len > 0
                && mem.check_remote_write(self.pd, reth.rkey, reth.va, u64::from(reth.dma_len)).is_err()
            {
                return Err(Refusal::Nak(NakCode::RemoteAccessError));
            }
            (reth.rkey, reth.va, u64::from(reth.dma_len), reth.dma_len)
        } else {
            match self.in_msg {
                Some(InMsg::Write { rkey, va, remaining, total }) => (rkey, va, remaining, total),
                _ => return Err(Refusal::Nak(NakCode::InvalidRequest)),
            }
        };
        if op.has_imm() && self.rq.is_empty() {
            return Err(Refusal::Rnr);
        }
        let plen = pkt.payload.len() as u64;
        let bad_len = plen > u64::from(self.mtu)
            || plen > remaining
            || (!op.is_last() && plen != u64::from(self.mtu))
            || (op.is_last() && plen != remaining);
        if bad_len {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        if plen > 0 && mem.write(self.pd, rkey, va, pkt.payload, Access::REMOTE_WRITE).is_err() {
            return Err(Refusal::Nak(NakCode::RemoteAccessError));
        }
        if op.is_last() {
            self.in_msg = None;
            if op.has_imm() {
                self.complete_recv(
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    total,
                    pkt.headers.imm,
                    bth.solicited,
                );
            }
        } else {
            self.in_msg = Some(InMsg::Write { rkey, va: va + plen, remaining: remaining - plen, total });
        }
        Ok(())
    }

    /// Executes a placement request (the responder side of [`super::place`]): the checks of
    /// a WRITE's first packet, then one copy from the requester's process. Returns the PSNs
    /// the request takes.
    fn rx_placed(
        &mut self,
        src: Ipv4Addr,
        pkt: &Packet<'_>,
        mem: &MrTable,
        stats: &mut FabricStats,
        place: &mut PlaceCtx<'_>,
    ) -> Result<u32, Refusal> {
        let bth = pkt.headers.bth;
        if self.in_msg.is_some() {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        }
        let Some(reth) = pkt.headers.reth else {
            return Err(Refusal::Nak(NakCode::InvalidRequest));
        };
        let w = PlacedWrite::parse(pkt.payload, reth.dma_len)
            .map_err(|_| Refusal::Nak(NakCode::InvalidRequest))?;
        if !self.qp_access.contains(Access::REMOTE_WRITE) {
            return Err(Refusal::Nak(NakCode::RemoteAccessError));
        }
        let len = u64::from(reth.dma_len);
        if mem.check_remote_write(self.pd, reth.rkey, reth.va, len).is_err() {
            return Err(Refusal::Nak(NakCode::RemoteAccessError));
        }
        if bth.opcode.has_imm() && self.rq.is_empty() {
            return Err(Refusal::Rnr);
        }
        let placed = place.place.place(place.wire, src, &w, mem, self.pd, reth.rkey, reth.va, len)?;
        let tail = PlacedTail { bth, dma_len: reth.dma_len, imm: pkt.headers.imm, psn_count: w.psn_count };
        match placed {
            Placing::Done(copied) => {
                self.placed_landed(copied, &tail, stats);
                Ok(w.psn_count)
            }
            Placing::Running => {
                self.placing = Some(tail);
                Err(Refusal::Running)
            }
        }
    }

    /// Counts a placed WRITE whose bytes are in place and completes its receive if it carries
    /// an immediate.
    fn placed_landed(&mut self, copied: Copied, t: &PlacedTail, stats: &mut FabricStats) {
        stats.placed_writes += 1;
        stats.placed_bytes += u64::from(t.dma_len);
        stats.placed_mapped += u64::from(copied == Copied::Mapped);
        if t.bth.opcode.has_imm() {
            self.complete_recv(
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                t.dma_len,
                t.imm,
                t.bth.solicited,
            );
        }
    }

    fn on_ack(&mut self, now: Instant, pkt: &Packet<'_>, stats: &mut FabricStats) {
        let Some(aeth) = pkt.headers.aeth else {
            stats.malformed += 1;
            return;
        };
        let p = pkt.headers.bth.psn;
        let in_flight = |qp: &RcQp, psn: u32| psn_diff(psn, qp.una) >= 0 && psn_diff(psn, qp.sent_end) < 0;
        match aeth.syndrome {
            Syndrome::Ack { .. } => self.on_positive_ack(now, p),
            Syndrome::RnrNak { timer } => {
                if !in_flight(self, p) {
                    return;
                }
                self.ack_upto(now, psn_add(p, packet::PSN_MASK));
                if self.rnr_retry != 7 {
                    if self.rnr_left == 0 {
                        self.fail_front(WcStatus::RnrRetryExcErr);
                        return;
                    }
                    self.rnr_left -= 1;
                }
                self.rewind(p);
                self.retx_timer = None;
                self.rnr_until = Some(now + packet::rnr_timer_duration(timer));
            }
            Syndrome::Nak(code) => {
                if !in_flight(self, p) {
                    return;
                }
                self.ack_upto(now, psn_add(p, packet::PSN_MASK));
                match code {
                    NakCode::PsnSequenceError => {
                        if self.retries_left == 0 {
                            self.fail_front(WcStatus::RetryExcErr);
                            return;
                        }
                        self.retries_left -= 1;
                        self.rewind(p);
                        self.arm_retx(now);
                    }
                    NakCode::InvalidRequest | NakCode::InvalidRdRequest => {
                        self.fail_front(WcStatus::RemInvReqErr)
                    }
                    NakCode::RemoteAccessError => self.fail_front(WcStatus::RemAccessErr),
                    NakCode::RemoteOperationalError => self.fail_front(WcStatus::RemOpErr),
                    NakCode::PlacementRefused => {
                        // Not an error: send it again from here on the wire (no retry spent).
                        if !self.place_refused {
                            self.place_refused = true;
                            stats.placed_refused += 1;
                        }
                        self.rewind(p);
                        self.arm_retx(now);
                    }
                }
            }
        }
    }

    /// A positive ACK (an ACK frame's or a [`PiggyAck`]) for everything up to `p`.
    fn on_positive_ack(&mut self, now: Instant, p: u32) {
        if psn_diff(p, self.una) < -1 || psn_diff(p, self.sent_end) >= 0 {
            return; // acknowledges nothing we have sent
        }
        self.ack_upto(now, p);
    }

    fn arm_retx(&mut self, now: Instant) {
        self.retx_timer = self.ack_timeout.map(|t| now + t);
    }

    /// Everything up to and including `p` is acknowledged.
    fn ack_upto(&mut self, now: Instant, p: u32) {
        if psn_diff(p, self.una) < 0 {
            return;
        }
        let mut popped = 0usize;
        while let Some(w) = self.sq.front() {
            if psn_diff(w.last_psn(), p) > 0 {
                break;
            }
            if let Some(w) = self.sq.pop_front() {
                popped += 1;
                if w.placed {
                    self.placed_extra -= i64::from(w.npkts) - 1;
                }
                if w.signaled {
                    self.completions.push(Completion {
                        cq: CqSel::Send,
                        wc: Wc {
                            wr_id: w.wr_id,
                            status: WcStatus::Success,
                            opcode: w.wc_opcode(),
                            byte_len: w.len,
                            qp_num: self.qpn,
                            imm_data: None,
                        },
                        solicited: false,
                    });
                }
            }
        }
        self.una = psn_add(p, 1);
        self.retries_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        if psn_diff(self.send_psn, self.una) < 0 {
            self.send_psn = self.una;
            self.relocate();
        } else {
            self.send_idx = self.send_idx.saturating_sub(popped);
        }
        if self.una == self.sent_end {
            self.retx_timer = None;
        } else {
            self.arm_retx(now);
        }
    }

    /// Points the transmit cursor at the packet with PSN `send_psn`; WQEs from there on count
    /// as not sent (placed or not).
    fn relocate(&mut self) {
        self.send_idx = self.sq.len();
        self.send_pkt = 0;
        for (i, w) in self.sq.iter().enumerate() {
            let off = psn_diff(self.send_psn, w.first_psn);
            if off >= 0 && (off as u32) < w.npkts {
                self.send_idx = i;
                self.send_pkt = off as u32;
                break;
            }
        }
        let mut extra = 0i64;
        for (i, w) in self.sq.iter_mut().enumerate() {
            if i >= self.send_idx {
                w.placed = false;
            } else if w.placed {
                extra += i64::from(w.npkts) - 1;
            }
        }
        self.placed_extra = extra;
    }

    fn rewind(&mut self, psn: u32) {
        self.send_psn = psn;
        self.relocate();
    }

    /// The oldest outstanding WQE failed with `status`: complete it and flush the rest.
    fn fail_front(&mut self, status: WcStatus) {
        self.fail_at(0, status);
    }

    fn fail_at(&mut self, idx: usize, status: WcStatus) {
        for _ in 0..idx {
            if let Some(w) = self.sq.pop_front() {
                self.flush_completion(CqSel::Send, w.wr_id, w.wc_opcode());
            }
        }
        if let Some(w) = self.sq.pop_front() {
            self.completions.push(Completion {
                cq: CqSel::Send,
                wc: Wc { wr_id: w.wr_id, status, opcode: w.wc_opcode(), qp_num: self.qpn, ..Wc::default() },
                solicited: false,
            });
        }
        self.enter_error();
    }

    /// Fires due timers.
    pub(crate) fn on_timer(&mut self, now: Instant, stats: &mut FabricStats) {
        if self.state != QpState::Rts {
            return;
        }
        if self.rnr_until.is_some_and(|t| now >= t) {
            self.rnr_until = None;
            self.arm_retx(now);
        }
        if self.retx_timer.is_some_and(|t| now >= t) {
            stats.timeouts += 1;
            if self.retries_left == 0 {
                self.fail_front(WcStatus::RetryExcErr);
                return;
            }
            self.retries_left -= 1;
            self.rewind(self.una);
            self.arm_retx(now);
        }
    }

    // ---------------------------------------------------------------- outbound

    /// Writes the next frame (headers + payload, room for pad and ICRC left at the end) into
    /// `buf`, which must hold a full-MTU frame. The caller seals it with the ICRC and sends it.
    ///
    /// Queued positive ACKs ride on the request packet sent in the same call, if there is
    /// one, as a [`PiggyAck`]; otherwise they leave at once, as one ACK frame for the last
    /// of them. They are never held back waiting for a request: measured, holding them one
    /// call for the reply to carry saved 0.1 us per ping but cost 8% of bulk bandwidth and
    /// 12% of the small-message rate, because the requester's completions came later. NAKs
    /// and RNR NAKs always go in frames of their own, in order.
    pub(crate) fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &MrTable,
        buf: &mut [u8],
        stats: &mut FabricStats,
    ) -> Option<TxFrame> {
        let dst = self.dest_ip?;
        if self.only_positive_acks() && self.request_ready(now) {
            if let Some(frame) = self.transmit_request(now, mem, buf, stats, dst) {
                return Some(frame);
            }
            // No request frame after all (it failed locally): the ACKs go on their own.
        }
        if let Some(ack) = self.next_standalone_ack() {
            let (psn, syndrome) = match ack {
                PendingAck::Ack { psn } => (psn, Syndrome::Ack { credit_code: NO_CREDIT_INFO }),
                PendingAck::Nak { psn, code } => (psn, Syndrome::Nak(code)),
                PendingAck::Rnr { psn } => (psn, Syndrome::RnrNak { timer: self.min_rnr_timer }),
            };
            let headers = Headers {
                bth: Bth::new(Opcode::RcAck, self.dest_qpn, psn),
                piggy: None,
                deth: None,
                reth: None,
                aeth: Some(Aeth { syndrome, msn: self.msn }),
                imm: None,
            };
            return match packet::emit_headers(&headers, 0, buf) {
                Ok(_) => Some(TxFrame { len: packet::frame_len(&headers, 0), dst }),
                Err(_) => None,
            };
        }
        if !self.request_ready(now) {
            return None;
        }
        self.transmit_request(now, mem, buf, stats, dst)
    }

    /// Writes the request packet at the transmit cursor, carrying the queued positive ACKs
    /// as a [`PiggyAck`] if those are all that is queued. The caller checked
    /// [`RcQp::request_ready`].
    fn transmit_request(
        &mut self,
        now: Instant,
        mem: &MrTable,
        buf: &mut [u8],
        stats: &mut FabricStats,
        dst: Ipv4Addr,
    ) -> Option<TxFrame> {
        self.rnr_until = None;
        let piggy = self.piggy();
        if let Some(nonce) = self.next_is_placed() {
            return self.transmit_placed(now, nonce, piggy, mem, buf, stats, dst);
        }
        let idx = self.send_idx;
        let k = self.send_pkt;
        let psn = self.send_psn;
        let w = self.sq.get(idx)?;
        let first = k == 0;
        let last = k + 1 == w.npkts;
        let (opcode, reth, imm) = match w.op {
            SendOp::Send => (pick(first, last, false, SEND_OPS), None, None),
            SendOp::SendWithImm { imm } => (pick(first, last, true, SEND_OPS), None, last.then_some(imm)),
            SendOp::RdmaWrite { remote_addr, rkey } => (
                pick(first, last, false, WRITE_OPS),
                first.then_some(Reth { va: remote_addr, rkey, dma_len: w.len }),
                None,
            ),
            SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => (
                pick(first, last, true, WRITE_OPS),
                first.then_some(Reth { va: remote_addr, rkey, dma_len: w.len }),
                last.then_some(imm),
            ),
        };
        let off = u64::from(k) * u64::from(self.mtu);
        let plen = (u64::from(w.len) - off).min(u64::from(self.mtu)) as usize;
        let window_full = psn_diff(psn_add(psn, 1), self.una) as i64 >= i64::from(self.max_inflight);
        let retransmit = psn_diff(psn, self.sent_end) < 0;
        let mut bth = Bth::new(opcode, self.dest_qpn, psn);
        // Retransmissions always ask for an ACK: any one that gets through makes progress.
        bth.ack_req = last || psn % ACK_REQ_INTERVAL == 0 || window_full || retransmit;
        bth.solicited = last && w.solicited;
        let headers = Headers { bth, piggy, deth: None, reth, aeth: None, imm };
        let hlen = packet::emit_headers(&headers, plen, buf).ok()?;
        let gathered = match (&w.inline, buf.get_mut(hlen..hlen + plen)) {
            (Some(data), Some(dst)) => match data.get(off as usize..off as usize + plen) {
                Some(src) => {
                    dst.copy_from_slice(src);
                    true
                }
                None => false,
            },
            (None, Some(dst)) => gather(mem, self.pd, &w.sges, off, dst),
            (_, None) => false,
        };
        if !gathered {
            self.fail_at(idx, WcStatus::LocProtErr);
            return None;
        }
        self.piggy_sent(piggy, stats);
        if retransmit {
            stats.retransmits += 1;
        } else {
            self.sent_end = psn_add(psn, 1);
        }
        self.send_psn = psn_add(psn, 1);
        if last {
            self.send_idx += 1;
            self.send_pkt = 0;
        } else {
            self.send_pkt += 1;
        }
        if self.retx_timer.is_none() {
            self.arm_retx(now);
        }
        Some(TxFrame { len: packet::frame_len(&headers, plen), dst })
    }
}

impl RcQp {
    /// Writes the placement request for the WRITE at the transmit cursor: its RETH and
    /// immediate, and the gather list (checked against the local keys, as a wire WRITE's
    /// gather would be) as addresses in this process.
    #[allow(clippy::too_many_arguments, reason = "the placed request and where it goes")]
    fn transmit_placed(
        &mut self,
        now: Instant,
        nonce: u64,
        piggy: Option<PiggyAck>,
        mem: &MrTable,
        buf: &mut [u8],
        stats: &mut FabricStats,
        dst: Ipv4Addr,
    ) -> Option<TxFrame> {
        let idx = self.send_idx;
        let psn = self.send_psn;
        let w = self.sq.get_mut(idx)?;
        let live = w.live.get_or_insert_with(LiveWord::new);
        let live = (live.addr(), live.token());
        let (opcode, va, rkey, imm) = match w.op {
            SendOp::RdmaWrite { remote_addr, rkey } => (Opcode::RcPlacedWrite, remote_addr, rkey, None),
            SendOp::RdmaWriteWithImm { remote_addr, rkey, imm } => {
                (Opcode::RcPlacedWriteImm, remote_addr, rkey, Some(imm))
            }
            SendOp::Send | SendOp::SendWithImm { .. } => return None,
        };
        let mut sges = Vec::with_capacity(w.sges.len());
        let mut local_ok = true;
        for sge in w.sges.iter().filter(|s| s.length > 0) {
            local_ok &= mem.check_local(self.pd, sge.lkey, sge.addr, u64::from(sge.length)).is_ok();
            sges.push((sge.addr, sge.length));
        }
        let mut bth = Bth::new(opcode, self.dest_qpn, psn);
        bth.ack_req = true;
        bth.solicited = w.solicited;
        let reth = Some(Reth { va, rkey, dma_len: w.len });
        let headers = Headers { bth, piggy, deth: None, reth, aeth: None, imm };
        let plen = PlacedWrite::len_for(sges.len());
        let (npkts, first_psn) = (w.npkts, w.first_psn);
        let hlen = packet::emit_headers(&headers, plen, buf).ok()?;
        let written = buf
            .get_mut(hlen..hlen + plen)
            .is_some_and(|out| PlacedWrite::emit(nonce, npkts, live, &sges, out));
        if !local_ok || !written || first_psn != psn {
            self.fail_at(idx, WcStatus::LocProtErr);
            return None;
        }
        self.piggy_sent(piggy, stats);
        let end = psn_add(psn, npkts);
        if psn_diff(psn, self.sent_end) < 0 {
            stats.retransmits += 1;
        } else {
            stats.placed_sent += 1;
        }
        if psn_diff(end, self.sent_end) > 0 {
            self.sent_end = end;
        }
        if let Some(w) = self.sq.get_mut(idx) {
            w.placed = true;
        }
        self.placed_extra += i64::from(npkts) - 1;
        self.send_psn = end;
        self.send_idx += 1;
        self.send_pkt = 0;
        if self.retx_timer.is_none() {
            self.arm_retx(now);
        }
        Some(TxFrame { len: packet::frame_len(&headers, plen), dst })
    }
}

/// Opcodes by (first, last, imm) for SEND and WRITE: [only, only_imm, first, middle, last, last_imm].
type OpTable = [Opcode; 6];
const SEND_OPS: OpTable = [
    Opcode::RcSendOnly,
    Opcode::RcSendOnlyImm,
    Opcode::RcSendFirst,
    Opcode::RcSendMiddle,
    Opcode::RcSendLast,
    Opcode::RcSendLastImm,
];
const WRITE_OPS: OpTable = [
    Opcode::RcWriteOnly,
    Opcode::RcWriteOnlyImm,
    Opcode::RcWriteFirst,
    Opcode::RcWriteMiddle,
    Opcode::RcWriteLast,
    Opcode::RcWriteLastImm,
];

fn pick(first: bool, last: bool, imm: bool, t: OpTable) -> Opcode {
    let [only, only_imm, first_op, middle, last_op, last_imm] = t;
    match (first, last, imm) {
        (true, true, false) => only,
        (true, true, true) => only_imm,
        (true, false, _) => first_op,
        (false, false, _) => middle,
        (false, true, false) => last_op,
        (false, true, true) => last_imm,
    }
}

/// Copies bytes `off..off+dst.len()` of the message described by `sges` into `dst`.
fn gather(mem: &MrTable, pd: u32, sges: &[Sge], off: u64, dst: &mut [u8]) -> bool {
    let mut skip = off;
    let mut at = 0usize;
    for sge in sges {
        if at == dst.len() {
            break;
        }
        let len = u64::from(sge.length);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(dst.len() - at);
        let Some(piece) = dst.get_mut(at..at + n) else { return false };
        if mem.read(pd, sge.lkey, sge.addr + skip, piece).is_err() {
            return false;
        }
        at += n;
        skip = 0;
    }
    at == dst.len()
}

/// Copies `data` into the receive described by `sges`, starting at byte `off`.
fn scatter(mem: &MrTable, pd: u32, sges: &[Sge], off: u64, data: &[u8]) -> bool {
    let mut skip = off;
    let mut at = 0usize;
    for sge in sges {
        if at == data.len() {
            break;
        }
        let len = u64::from(sge.length);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = ((len - skip) as usize).min(data.len() - at);
        let Some(piece) = data.get(at..at + n) else { return false };
        if mem.write(pd, sge.lkey, sge.addr + skip, piece, Access::LOCAL_WRITE).is_err() {
            return false;
        }
        at += n;
        skip = 0;
    }
    at == data.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sge_lists_keep_every_entry_inline_or_on_the_heap() {
        let all: Vec<Sge> = (0..5u32)
            .map(|i| Sge { addr: 0x1000 * u64::from(i + 1), length: 7 + i, lkey: 100 + i })
            .collect();
        for n in 0..=all.len() {
            let list = SgeList::new(&all[..n]);
            assert_eq!(&*list, &all[..n], "{n} SGEs");
            assert_eq!(matches!(list, SgeList::Inline { .. }), n <= INLINE_SGES, "{n} SGEs");
        }
    }
}
