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
//!   `retry_cnt` retries; the counter resets whenever an ACK makes progress. A sequence NAK
//!   naming the PSN a retry round already resends from (the network duplicated the NAK, or it
//!   crossed the timer's round) asks for nothing new and spends nothing, as in rxe. Retries exhausted
//!   → `RETRY_EXC_ERR`. An RNR NAK pauses for the peer's timer and spends one of `rnr_retry`
//!   (7 = forever) → `RNR_RETRY_EXC_ERR`; a copy of it arriving during the pause spends
//!   nothing. A copy arriving *after* the pause, once the message went again, cannot be told
//!   from a second RNR NAK (nothing in the PSN or the AETH says which round it answers, in
//!   rxe either): it spends a retry and rewinds, and with none left fails the WR with
//!   `RNR_RETRY_EXC_ERR` although the resent message may be delivered. Only a duplicating
//!   network makes such copies (fault injection here; not an IB link). Completions are
//!   generated in posting order.
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
//!
//! This file holds the QP context, its verbs (modify, post, completions) and the dispatch of
//! packets in; the two halves are `requester` (ACKs in, frames out) and `responder`
//! (requests in, ACKs and NAKs queued).

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use super::live::LiveWord;
use super::mem::MrTable;
use super::packet::{self, Bth, NakCode, Opcode, Packet, PiggyAck, psn_add, psn_diff};
use super::place::{MAX_PLACED_SGES, Placement, Unplaced};
use super::wire::Wire;
use crate::fabric::{
    Access, AsyncEvent, FabricError, FabricStats, QpCaps, QpModify, QpState, RecvWr, SendOp, SendWr, Sge, Wc,
    WcOpcode, WcStatus,
};
use crate::time::Instant;

mod requester;
mod responder;

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

    /// Whether completions or async events wait to be taken.
    pub(crate) fn has_output(&self) -> bool {
        self.has_completions() || !self.events.is_empty()
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
