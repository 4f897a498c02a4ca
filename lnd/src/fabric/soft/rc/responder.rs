//! The responder half of an RC QP: request packets accepted in PSN order (duplicates
//! re-acknowledged, gaps NAKed once), SENDs matched to posted receives, WRITEs checked against
//! the MR table before a byte lands, same-host placements executed in PSN order, and the ACKs
//! and NAKs they produce queued for [`RcQp::poll_transmit`].

use std::net::Ipv4Addr;

use super::{ACK_QUEUE_MAX, Completion, CqSel, InMsg, PendingAck, PlaceCtx, PlacedTail, RcQp, Refusal};
use crate::fabric::soft::mem::MrTable;
use crate::fabric::soft::packet::{self, Bth, NakCode, Packet, psn_add, psn_diff};
use crate::fabric::soft::place::{Copied, PlacedWrite, Placing, Unplaced};
use crate::fabric::{Access, AsyncEvent, FabricStats, QpState, Sge, Wc, WcOpcode, WcStatus};

impl RcQp {
    /// Queues a response; when the queue is full, newer ACKs replace an ACK at its tail.
    pub(super) fn queue_ack(&mut self, a: PendingAck) {
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

    pub(super) fn ack_expected(&mut self) {
        self.queue_ack(PendingAck::Ack { psn: psn_add(self.epsn, packet::PSN_MASK) });
    }

    pub(super) fn on_request(
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
    pub(super) fn accept(&mut self, bth: Bth, result: Result<u32, Refusal>, stats: &mut FabricStats) {
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

    pub(super) fn complete_recv(
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

    pub(super) fn rx_send(&mut self, pkt: &Packet<'_>, mem: &MrTable) -> Result<(), Refusal> {
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

    pub(super) fn rx_write(&mut self, pkt: &Packet<'_>, mem: &MrTable) -> Result<(), Refusal> {
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
    pub(super) fn rx_placed(
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
    pub(super) fn placed_landed(&mut self, copied: Copied, t: &PlacedTail, stats: &mut FabricStats) {
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
