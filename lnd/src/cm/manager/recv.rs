//! The CM messages a [`Cm`] receives (Linux `cm_req_handler`, `cm_rep_handler`, ...), each
//! checked in Linux's order against the id it names, and the expiry of an id's timer:
//! retransmission of the identical MAD, give-up after the retry budget, the end of TIMEWAIT.

use super::{Cm, CmEvent, Conn, ConnId, ConnState, padded, rej};
use crate::cm::ip_cm::split_req_private_data;
use crate::cm::mad::{
    CmMessage, Drep, Dreq, MessageMraed, MessageRejected, Mra, REJ_PRIVATE_DATA_LEN, Rej, RejReason, Rep,
    Req, Rtu, TransportType, linux_cm_timeout,
};
use crate::fabric::types::PortAddr;
use crate::time::Instant;

impl Cm {
    pub(super) fn on_req(&mut self, now: Instant, from: PortAddr, tid: u64, req: &Req) {
        let remote = req.local_comm_id;
        if remote == 0 {
            self.stats.invalid_req += 1;
            return;
        }
        // (1) Duplicate.
        if let Some(&lid) = self.by_remote_id.get(&(remote, req.local_ca_guid)) {
            self.stats.duplicates.req += 1;
            if self.conns.get(&lid).is_some_and(|c| c.state == ConnState::Timewait) {
                let r = rej(lid, remote, MessageRejected::Other, RejReason::StaleConn);
                self.stats.rej_stale_conn += 1;
                self.send(from, tid, CmMessage::Rej(r));
            }
            return;
        }
        // (2) Stale: the requester's QP still belongs to a live connection.
        if let Some(&old) = self.by_remote_qpn.get(&(req.local_qpn, req.local_ca_guid)) {
            self.stats.rej_stale_conn += 1;
            self.send(from, tid, CmMessage::Rej(rej(0, remote, MessageRejected::Req, RejReason::StaleConn)));
            if self.conns.get(&old).is_some_and(|c| c.state == ConnState::Established) {
                self.send_dreq(now, old, true);
            }
            return;
        }
        // (3) Listener.
        if !self.listeners.contains(&req.service_id) {
            self.stats.rej_invalid_service_id += 1;
            let r = rej(0, remote, MessageRejected::Req, RejReason::InvalidServiceId);
            self.send(from, tid, CmMessage::Rej(r));
            return;
        }
        // What this CM cannot serve.
        let refusal = if req.transport_type != TransportType::Rc {
            Some(rej(0, remote, MessageRejected::Req, RejReason::InvalidTransportType))
        } else if req.primary_path.remote_gid != self.cfg.local.gid {
            let mut r = rej(0, remote, MessageRejected::Req, RejReason::InvalidGid);
            r.reject_info_length = 16;
            r.ari = padded(&self.cfg.local.gid.0);
            Some(r)
        } else {
            None
        };
        if let Some(r) = refusal {
            self.stats.invalid_req += 1;
            self.send(from, tid, CmMessage::Rej(r));
            return;
        }
        let parsed = split_req_private_data(&req.private_data)
            .ok()
            .filter(|(h, _)| self.cfg.local_ip.is_unspecified() || h.dst == self.cfg.local_ip);
        let Some((cma, consumer)) = parsed else {
            self.stats.invalid_req += 1;
            let r = rej(0, remote, MessageRejected::Req, RejReason::ConsumerDefined);
            self.send(from, tid, CmMessage::Rej(r));
            return;
        };
        let consumer = *consumer;
        if self.pending_requests >= self.cfg.max_pending_requests {
            self.stats.rej_no_resources += 1;
            let r = rej(0, remote, MessageRejected::Req, RejReason::NoResources);
            self.send(from, tid, CmMessage::Rej(r));
            return;
        }
        let id = self.alloc_id();
        let timeout = linux_cm_timeout(req.local_cm_response_timeout);
        let conn = Conn {
            state: ConnState::ReqRcvd,
            peer: from,
            tid,
            remote_comm_id: remote,
            remote_ca_guid: req.local_ca_guid,
            local_qpn: 0,
            remote_qpn: req.local_qpn,
            base_timeout: timeout,
            cur_timeout: timeout,
            max_retries: req.max_cm_retries,
            retries_left: req.max_cm_retries,
            ack_timeout: req.primary_path.local_ack_timeout,
            outstanding: None,
            rtu: None,
            timer: None,
            remote_id_key: true,
            remote_qpn_key: true,
        };
        self.conns.insert(id, conn);
        self.by_remote_id.insert((remote, req.local_ca_guid), id);
        self.by_remote_qpn.insert((req.local_qpn, req.local_ca_guid), id);
        self.pending_requests += 1;
        self.events.push_back(CmEvent::ConnectRequest {
            id: ConnId(id),
            from,
            service_id: req.service_id,
            cma,
            private_data: consumer,
            remote_qpn: req.local_qpn,
            remote_start_psn: req.starting_psn,
            path_mtu: req.path_mtu,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            local_ack_timeout: req.primary_path.local_ack_timeout,
            remote_ca_guid: req.local_ca_guid,
        });
    }

    pub(super) fn on_rep(&mut self, now: Instant, from: PortAddr, tid: u64, rep: &Rep) {
        let lid = rep.remote_comm_id;
        let Some(c) = self.conns.get(&lid) else {
            self.stats.unknown_comm_id += 1;
            return;
        };
        if c.remote_comm_id != 0 {
            // Linux `cm_dup_rep_handler`: a REP for an id that already has its peer.
            if c.remote_comm_id != rep.local_comm_id {
                self.stats.unknown_comm_id += 1;
            } else if c.state == ConnState::Established {
                self.stats.duplicates.rep += 1;
                if let Some(rtu) = c.rtu {
                    let peer = c.peer;
                    self.push_tx(peer, rtu);
                }
            } else {
                self.stats.duplicates.rep += 1;
            }
            return;
        }
        if !matches!(c.state, ConnState::ReqSent | ConnState::MraReqRcvd) {
            self.stats.unexpected_state += 1;
            return;
        }
        let id_key = (rep.local_comm_id, rep.local_ca_guid);
        let qpn_key = (rep.local_qpn, rep.local_ca_guid);
        if self.by_remote_id.contains_key(&id_key) {
            self.stats.duplicates.rep += 1;
            return;
        }
        if let Some(&old) = self.by_remote_qpn.get(&qpn_key) {
            self.stats.rej_stale_conn += 1;
            let r = rej(lid, rep.local_comm_id, MessageRejected::Rep, RejReason::StaleConn);
            self.send(from, tid, CmMessage::Rej(r));
            if self.conns.get(&old).is_some_and(|c| c.state == ConnState::Established) {
                self.send_dreq(now, old, true);
            }
            self.events.push_back(CmEvent::Rejected {
                id: ConnId(lid),
                reason: RejReason::StaleConn,
                private_data: [0; REJ_PRIVATE_DATA_LEN],
            });
            self.enter_timewait(now, lid);
            return;
        }
        self.disarm(lid);
        self.set_state(lid, ConnState::RepRcvd);
        if let Some(c) = self.conns.get_mut(&lid) {
            c.remote_comm_id = rep.local_comm_id;
            c.remote_ca_guid = rep.local_ca_guid;
            c.remote_qpn = rep.local_qpn;
            c.outstanding = None;
            c.remote_id_key = true;
            c.remote_qpn_key = true;
        }
        self.by_remote_id.insert(id_key, lid);
        self.by_remote_qpn.insert(qpn_key, lid);
        self.events.push_back(CmEvent::Reply {
            id: ConnId(lid),
            remote_qpn: rep.local_qpn,
            remote_start_psn: rep.starting_psn,
            private_data: rep.private_data,
            rnr_retry_count: rep.rnr_retry_count,
        });
    }

    pub(super) fn on_rtu(&mut self, rtu: &Rtu) {
        let Some(state) = self.matched(rtu.remote_comm_id, rtu.local_comm_id).map(|c| c.state) else {
            self.stats.unknown_comm_id += 1;
            return;
        };
        if matches!(state, ConnState::RepSent | ConnState::MraRepRcvd) {
            self.establish_passive(rtu.remote_comm_id);
        } else {
            self.stats.duplicates.rtu += 1;
        }
    }

    pub(super) fn on_rej(&mut self, now: Instant, r: &Rej) {
        // Linux `cm_acquire_rejected_id`.
        let lid = if r.reason == RejReason::Timeout {
            let guid = r.ari.first_chunk::<8>().map_or(0, |b| u64::from_be_bytes(*b));
            self.by_remote_id.get(&(r.local_comm_id, guid)).copied()
        } else if r.message_rejected == MessageRejected::Req {
            self.matched(r.remote_comm_id, 0).map(|_| r.remote_comm_id)
        } else {
            self.matched(r.remote_comm_id, r.local_comm_id).map(|_| r.remote_comm_id)
        };
        let Some((lid, state)) = lid.and_then(|l| self.conns.get(&l).map(|c| (l, c.state))) else {
            self.stats.unknown_comm_id += 1;
            return;
        };
        let id = ConnId(lid);
        let rejected = CmEvent::Rejected { id, reason: r.reason, private_data: r.private_data };
        match state {
            ConnState::ReqSent
            | ConnState::MraReqRcvd
            | ConnState::ReqRcvd
            | ConnState::RepSent
            | ConnState::MraRepRcvd => {
                self.events.push_back(rejected);
                if r.reason == RejReason::StaleConn {
                    self.enter_timewait(now, lid);
                } else {
                    self.free(lid);
                }
            }
            ConnState::RepRcvd => {
                self.events.push_back(rejected);
                self.enter_timewait(now, lid);
            }
            ConnState::Established | ConnState::DreqSent => {
                self.events.push_back(CmEvent::Disconnected { id });
                self.enter_timewait(now, lid);
            }
            ConnState::Timewait => self.stats.unexpected_state += 1,
        }
    }

    pub(super) fn on_mra(&mut self, now: Instant, m: &Mra) {
        let remote = if m.message_mraed == MessageMraed::Req { 0 } else { m.local_comm_id };
        let Some(c) = self.matched(m.remote_comm_id, remote) else {
            self.stats.unknown_comm_id += 1;
            return;
        };
        let (state, ack_timeout) = (c.state, c.ack_timeout);
        let next = match (state, m.message_mraed) {
            (ConnState::ReqSent, MessageMraed::Req) => ConnState::MraReqRcvd,
            (ConnState::RepSent, MessageMraed::Rep) => ConnState::MraRepRcvd,
            (ConnState::MraReqRcvd | ConnState::MraRepRcvd, _) => {
                self.stats.duplicates.mra += 1;
                return;
            }
            _ => {
                self.stats.unexpected_state += 1;
                return;
            }
        };
        let timeout = linux_cm_timeout(m.service_timeout) + linux_cm_timeout(ack_timeout);
        let lid = m.remote_comm_id;
        self.set_state(lid, next);
        if let Some(c) = self.conns.get_mut(&lid) {
            c.cur_timeout = timeout;
        }
        self.disarm(lid);
        self.arm(lid, now + timeout);
    }

    pub(super) fn on_dreq(&mut self, now: Instant, from: PortAddr, tid: u64, d: &Dreq) {
        let lid = d.remote_comm_id;
        let drep = Drep { local_comm_id: lid, remote_comm_id: d.local_comm_id, ..Drep::default() };
        let Some(c) = self.matched(lid, d.local_comm_id) else {
            self.stats.unknown_comm_id += 1;
            self.send(from, tid, CmMessage::Drep(drep));
            return;
        };
        let (local_qpn, peer, state) = (c.local_qpn, c.peer, c.state);
        if local_qpn != d.remote_qpn {
            self.stats.dreq_qpn_mismatch += 1;
            return;
        }
        match state {
            ConnState::Established | ConnState::RepSent | ConnState::MraRepRcvd | ConnState::DreqSent => {
                self.send(peer, tid, CmMessage::Drep(drep));
                self.events.push_back(CmEvent::Disconnected { id: ConnId(lid) });
                self.enter_timewait(now, lid);
            }
            ConnState::Timewait => {
                self.stats.duplicates.dreq += 1;
                self.send(peer, tid, CmMessage::Drep(drep));
            }
            _ => self.stats.unexpected_state += 1,
        }
    }

    pub(super) fn on_drep(&mut self, now: Instant, d: &Drep) {
        let Some(state) = self.matched(d.remote_comm_id, d.local_comm_id).map(|c| c.state) else {
            self.stats.unknown_comm_id += 1;
            return;
        };
        match state {
            ConnState::DreqSent => {
                let lid = d.remote_comm_id;
                self.events.push_back(CmEvent::Disconnected { id: ConnId(lid) });
                self.enter_timewait(now, lid);
            }
            ConnState::Timewait => self.stats.duplicates.drep += 1,
            _ => self.stats.unexpected_state += 1,
        }
    }

    pub(super) fn on_timer(&mut self, now: Instant, lid: u32) {
        let Some(c) = self.conns.get_mut(&lid) else {
            return;
        };
        let state = c.state;
        match state {
            ConnState::ReqSent
            | ConnState::MraReqRcvd
            | ConnState::RepSent
            | ConnState::MraRepRcvd
            | ConnState::DreqSent => {
                let resend = if c.retries_left > 0 { c.outstanding } else { None };
                if let Some(mad) = resend {
                    c.retries_left -= 1;
                    let (peer, timeout) = (c.peer, c.cur_timeout);
                    if let Some(attr_id) = mad.get(16..18).and_then(|b| b.first_chunk::<2>()) {
                        self.stats.retransmitted.bump(u16::from_be_bytes(*attr_id));
                    }
                    self.push_tx(peer, mad);
                    self.arm(lid, now + timeout);
                    return;
                }
                let id = ConnId(lid);
                match state {
                    ConnState::ReqSent | ConnState::MraReqRcvd => {
                        self.stats.req_timeouts += 1;
                        self.events.push_back(CmEvent::Unreachable { id });
                        self.free(lid);
                    }
                    ConnState::RepSent | ConnState::MraRepRcvd => {
                        self.stats.rep_timeouts += 1;
                        self.events.push_back(CmEvent::ReplyTimedOut { id });
                        self.free(lid);
                    }
                    _ => {
                        self.stats.dreq_timeouts += 1;
                        self.events.push_back(CmEvent::Disconnected { id });
                        self.enter_timewait(now, lid);
                    }
                }
            }
            ConnState::Timewait => self.free(lid),
            ConnState::ReqRcvd | ConnState::RepRcvd | ConnState::Established => {}
        }
    }
}
