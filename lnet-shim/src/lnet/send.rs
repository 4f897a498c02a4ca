//! The sending side: PUT and GET from bound MDs, the ACKs and REPLYs LNet sends itself,
//! credits, and what `send_done` turns into.

use super::md::Pending;
use super::ni::CreditState;
use super::{AckReq, AckTo, LnetError, Msg, MsgKind, Outgoing, ReplyTo, State, Work, event_template};
use crate::event::{Errno, EventKind};
use crate::hdr::{AckMsg, GetMsg, LnetHdr, LnetMsg, LnetMsgType, PutMsg, ReplyMsg, WireHandle};
use crate::lnd::{Frags, Health, LndError, LndSend, SendStatus, frags_len};
use crate::matching::MdHandle;
use crate::nid::ProcessId;

impl State {
    /// The bound MD behind `md`, checked for starting an operation that needs `needed`
    /// operations of its threshold.
    fn initiator_md(&self, md: MdHandle, needed: u32) -> Result<u64, LnetError> {
        let id = md.cookie();
        let rec = self.mds.get(&id).ok_or(LnetError::StaleMd)?;
        if rec.attached.is_some() {
            return Err(LnetError::MdAttached);
        }
        if rec.unlinked {
            return Err(LnetError::StaleMd);
        }
        let left = rec.ops_left();
        if left < needed {
            return Err(LnetError::MdExhausted { needed, left });
        }
        Ok(id)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_put(
        &mut self,
        md: MdHandle,
        ack: AckReq,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
        hdr_data: u64,
        work: &mut Work,
    ) -> Result<(), LnetError> {
        self.check_running()?;
        let want_ack = ack == AckReq::Ack;
        let needed = if want_ack { 2 } else { 1 };
        let id = self.initiator_md(md, needed)?;
        let ni = self.route(target.nid).ok_or(LnetError::NoRoute { target })?;
        let me = ProcessId::new(self.nis[ni].nid, self.pid);
        // The token first: the ACK comes back to this operation's own handle.
        let token = self.new_token();
        let ack_wmd = if want_ack { self.wire_handle(token) } else { WireHandle::NONE };
        let Some(rec) = self.mds.get_mut(&id) else { return Err(LnetError::StaleMd) };
        rec.consume(needed);
        rec.refs += needed;
        let length = rec.length;
        let payload = rec.frags.clone();
        let hdr = LnetHdr {
            dest: target,
            src: me,
            payload_length: length as u32,
            msg: LnetMsg::Put(PutMsg { ack_wmd, match_bits, hdr_data, ptl_index: portal, offset }),
        };
        let template = event_template(
            EventKind::Send,
            me,
            target,
            portal,
            match_bits,
            length,
            length,
            u64::from(offset),
            hdr_data,
            &hdr,
        );
        let send = LndSend { target: target.nid, hdr, payload, get_sink: None, token };
        self.launch(ni, send, MsgKind::Put { md: id, template, ack: want_ack }, work);
        if want_ack {
            let mut t = template;
            t.kind = EventKind::Ack;
            t.msg_type = Some(LnetMsgType::Ack);
            t.mlength = 0;
            let p = Pending {
                op: token,
                kind: EventKind::Ack,
                peer: target.nid,
                match_bits,
                template: t,
                sweeps: 0,
            };
            self.push_pending(id, p);
        }
        Ok(())
    }

    pub(super) fn start_get(
        &mut self,
        md: MdHandle,
        target: ProcessId,
        portal: u32,
        match_bits: u64,
        offset: u32,
        work: &mut Work,
    ) -> Result<(), LnetError> {
        self.check_running()?;
        let id = self.initiator_md(md, 2)?;
        let ni = self.route(target.nid).ok_or(LnetError::NoRoute { target })?;
        let me = ProcessId::new(self.nis[ni].nid, self.pid);
        let token = self.new_token();
        let return_wmd = self.wire_handle(token);
        let Some(rec) = self.mds.get_mut(&id) else { return Err(LnetError::StaleMd) };
        rec.consume(2);
        rec.refs += 2;
        let length = rec.length;
        let sink = rec.frags.clone();
        let hdr = LnetHdr {
            dest: target,
            src: me,
            payload_length: 0,
            msg: LnetMsg::Get(GetMsg {
                return_wmd,
                match_bits,
                ptl_index: portal,
                src_offset: offset,
                sink_length: length as u32,
            }),
        };
        let template = event_template(
            EventKind::Send,
            me,
            target,
            portal,
            match_bits,
            length,
            length,
            u64::from(offset),
            0,
            &hdr,
        );
        let send = LndSend { target: target.nid, hdr, payload: Frags::new(), get_sink: Some(sink), token };
        self.launch(ni, send, MsgKind::Get { md: id, template }, work);
        let mut t = template;
        t.kind = EventKind::Reply;
        t.msg_type = Some(LnetMsgType::Reply);
        t.mlength = 0;
        t.offset = 0;
        let p = Pending {
            op: token,
            kind: EventKind::Reply,
            peer: target.nid,
            match_bits,
            template: t,
            sweeps: 0,
        };
        self.push_pending(id, p);
        Ok(())
    }

    /// Sends an ACK for a received PUT (`mlength` [`super::DROP_NAK_MLENGTH`] for a drop NAK).
    pub(super) fn send_ack(&mut self, ni: usize, ack: AckTo, work: &mut Work) {
        let hdr = LnetHdr {
            dest: ack.to,
            src: ack.me,
            payload_length: 0,
            msg: LnetMsg::Ack(AckMsg { dst_wmd: ack.wmd, match_bits: ack.match_bits, mlength: ack.mlength }),
        };
        let send = LndSend { target: ack.to.nid, hdr, payload: Frags::new(), get_sink: None, token: 0 };
        self.launch(ni, send, MsgKind::Ack, work);
    }

    /// Sends the REPLY message answering a header-only GET served from MD `md`; the GET event
    /// follows when it is sent.
    pub(super) fn send_reply(
        &mut self,
        ni: usize,
        md: u64,
        template: crate::event::Event,
        reply: ReplyTo,
        work: &mut Work,
    ) {
        let len = frags_len(&reply.frags).unwrap_or(0);
        let hdr = LnetHdr {
            dest: reply.to,
            src: reply.me,
            payload_length: len as u32,
            msg: LnetMsg::Reply(ReplyMsg { dst_wmd: reply.wmd }),
        };
        let send = LndSend { target: reply.to.nid, hdr, payload: reply.frags, get_sink: None, token: 0 };
        self.launch(ni, send, MsgKind::Reply { md, template }, work);
    }

    /// Registers a message and hands it on (a self-send at once; otherwise once it has
    /// credits). Its token is `send.token`, or a new one if that is 0 (a PUT or GET takes its
    /// own first: its wire handle names it). Returns the token.
    pub(super) fn launch(&mut self, ni: usize, mut send: LndSend, kind: MsgKind, work: &mut Work) -> u64 {
        let token = if send.token == 0 { self.new_token() } else { send.token };
        send.token = token;
        let target = send.target;
        let msg = |credit, queued| Msg { ni, peer: target, credit, queued, kind };
        let Some(n) = self.nis.get_mut(ni) else {
            self.msgs.insert(token, msg(CreditState::None, None));
            work.sends.push_back(Outgoing::Fail {
                token,
                error: LndError::new(Errno::EHOSTUNREACH, Health::LocalError),
            });
            return token;
        };
        if n.nid == target {
            self.msgs.insert(token, msg(CreditState::None, None));
            self.hand_off(ni, send, work);
            return token;
        }
        // The credits first, so the message enters the table once, complete.
        let state = n.take(target, token);
        if state == CreditState::Both {
            self.msgs.insert(token, msg(state, None));
            self.hand_off(ni, send, work);
        } else {
            self.msgs.insert(token, msg(state, Some(Box::new(send))));
        }
        token
    }

    /// Counts a send and queues it for the LND (or local delivery).
    fn hand_off(&mut self, ni: usize, send: LndSend, work: &mut Work) {
        let Some(n) = self.nis.get_mut(ni) else { return };
        let bytes = u64::from(send.hdr.payload_length);
        n.counters.send_count += 1;
        n.counters.send_bytes += bytes;
        let p = n.peer_mut(send.target);
        p.counters.send_count += 1;
        p.counters.send_bytes += bytes;
        if send.target == n.nid {
            work.sends.push_back(Outgoing::Local { ni, msg: send });
            return;
        }
        match &n.lnd {
            Some(lnd) => work.sends.push_back(Outgoing::Lnd { lnd: lnd.clone(), msg: send }),
            None => work.sends.push_back(Outgoing::Fail {
                token: send.token,
                error: LndError::new(Errno::EHOSTUNREACH, Health::LocalError),
            }),
        }
    }

    /// The LND finished send `token` (or LNet gave up on it): credits go back, waiting messages
    /// move on, events follow.
    pub(super) fn send_done(&mut self, token: u64, result: Result<SendStatus, LndError>, work: &mut Work) {
        let Some(msg) = self.msgs.get(&token) else { return };
        if !msg.kind.is_send() {
            return; // an LND reporting a receive token as a send: ignore
        }
        let Some(msg) = self.msgs.remove(&token) else { return };
        if msg.credit == CreditState::Both {
            self.return_credits(msg.ni, msg.peer, work);
        }
        if result.is_err() {
            if let Some(n) = self.nis.get_mut(msg.ni) {
                n.counters.send_errors += 1;
                n.peer_mut(msg.peer).counters.send_errors += 1;
            }
        }
        let status = result.map(|_| ()).map_err(|e| e.errno);
        match msg.kind {
            MsgKind::Put { md, template, ack } => {
                self.md_event(md, EventKind::Send, &template, status, true, work);
                self.release_held(md, token, work);
                if ack && status.is_err() {
                    if let Some(p) = self.take_pending_of(md, token) {
                        self.md_event(md, EventKind::Ack, &p.template, status, true, work);
                    }
                }
            }
            MsgKind::Get { md, template } => {
                self.md_event(md, EventKind::Send, &template, status, true, work);
                self.release_held(md, token, work);
                match result {
                    // More than the MD holds: the LND (or the peer behind it) is wrong, and an
                    // event with that mlength would send the caller outside its buffer.
                    Ok(SendStatus { reply_len: Some(n) }) if n as u64 > self.md_length(md) => {
                        if let Some(p) = self.take_pending_of(md, token) {
                            self.md_event(md, EventKind::Reply, &p.template, Err(Errno::EPROTO), true, work);
                        }
                    }
                    Ok(SendStatus { reply_len: Some(n) }) => {
                        if let Some(p) = self.take_pending_of(md, token) {
                            let mut t = p.template;
                            t.mlength = n as u64;
                            if let Some(n) = self.nis.get_mut(msg.ni) {
                                n.counters.recv_count += 1;
                                n.counters.recv_bytes += t.mlength;
                                let peer = n.peer_mut(msg.peer);
                                peer.counters.recv_count += 1;
                                peer.counters.recv_bytes += t.mlength;
                            }
                            self.md_event(md, EventKind::Reply, &t, Ok(()), true, work);
                        }
                    }
                    // A header-only GET: the REPLY message is still to come.
                    Ok(SendStatus { reply_len: None }) => {}
                    Err(e) => {
                        if let Some(p) = self.take_pending_of(md, token) {
                            self.md_event(md, EventKind::Reply, &p.template, Err(e.errno), true, work);
                        }
                    }
                }
            }
            MsgKind::Ack => {}
            MsgKind::Reply { md, template } => {
                self.md_event(md, EventKind::Get, &template, status, true, work);
            }
            MsgKind::RecvPut { .. }
            | MsgKind::RecvGet { .. }
            | MsgKind::RecvReply { .. }
            | MsgKind::RecvDelayed { .. } => {}
        }
    }

    /// Gives a finished message's credits back and hands on the messages that now have both.
    fn return_credits(&mut self, ni: usize, peer: crate::nid::Nid, work: &mut Work) {
        let moved = match self.nis.get_mut(ni) {
            Some(n) => n.give_back(peer),
            None => return,
        };
        for (t, state) in moved {
            let Some(m) = self.msgs.get_mut(&t) else { continue };
            m.credit = state;
            if state == CreditState::Both {
                if let Some(send) = m.queued.take() {
                    let ni = m.ni;
                    self.hand_off(ni, *send, work);
                }
            }
        }
    }
}
