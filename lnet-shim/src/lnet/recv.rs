//! The receiving side: the upcalls an LND makes (`lnet_parse`, `lnet_finalize`), matching
//! incoming PUTs and GETs, and ACKs and REPLYs for our own operations.
//!
//! Nothing here trusts the peer: every field of the header is checked against LNet's state
//! before it is used, and anything that does not fit is dropped and counted.

use std::sync::Weak;

use super::md::slice_frags;
use super::{AckTo, DROP_NAK_MLENGTH, Inner, MsgKind, Phase, ReplyTo, State, Work, event_template};
use super::{Msg, ni::CreditState};
use crate::event::{Errno, EventKind};
use crate::hdr::{AckMsg, GetMsg, LnetHdr, LnetMsg, PutMsg, ReplyMsg};
use crate::lnd::{Frags, LndError, LndUpcalls, RecvDisposition, SendStatus, deliver_immediate};
use crate::matching::{DropReason, MatchResult, Matched, MdOptions};
use crate::nid::{Nid, ProcessId};

/// LNet's upcall object for one NI (what [`crate::Lnd`]s call). Holds LNet weakly: an LND never
/// keeps LNet alive.
pub(super) struct NiUpcalls {
    lnet: Weak<Inner>,
    ni: usize,
}

impl NiUpcalls {
    pub(super) fn new(lnet: Weak<Inner>, ni: usize) -> NiUpcalls {
        NiUpcalls { lnet, ni }
    }
}

impl LndUpcalls for NiUpcalls {
    fn recv(&self, from: Nid, hdr: &LnetHdr, rdma: bool) -> RecvDisposition {
        match self.lnet.upgrade() {
            Some(inner) => inner.run(|st, work| st.recv(self.ni, from, hdr, rdma, work)),
            None => RecvDisposition::Drop,
        }
    }

    fn recv_done(&self, token: u64, result: Result<usize, LndError>) {
        if let Some(inner) = self.lnet.upgrade() {
            inner.run(|st, work| st.recv_done(token, result, work));
        }
    }

    fn send_done(&self, token: u64, result: Result<SendStatus, LndError>) {
        if let Some(inner) = self.lnet.upgrade() {
            inner.run(|st, work| st.send_done(token, result, work));
        }
    }

    /// The default's three steps under one lock: the copy is at most an IMMEDIATE's payload,
    /// and the message is finished before the lock is let go, so it never needs a token.
    fn recv_immediate(&self, from: Nid, hdr: &LnetHdr, payload: &[u8]) {
        if let Some(inner) = self.lnet.upgrade() {
            inner.run(|st, work| match st.parse(self.ni, from, hdr, false, work) {
                Parsed::Drop => {}
                Parsed::Sink { frags, mlength, msg } => {
                    let delivered = deliver_immediate(&frags, mlength, hdr.payload_length, payload);
                    st.finish_recv(msg, delivered, work);
                }
                Parsed::Source { msg, .. } => st.finish_recv(msg, Ok(0), work),
            });
        }
    }
}

/// What `lnet_parse` made of an incoming message, before it is registered under a token.
pub(super) enum Parsed {
    Drop,
    Sink { frags: Frags, mlength: usize, msg: Msg },
    Source { frags: Frags, msg: Msg },
}

/// Why an incoming message is dropped (counted per NI by reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DropWhy {
    Match(DropReason),
    /// A PUT a lazy portal would have kept, but the bytes kept were at the limit.
    LazyFull,
    /// A PUT a lazy portal kept, discarded when the portal was cleared or LNet shut down.
    LazyDiscarded,
    NotForMe,
    Routed,
    Unexpected,
    BadType,
}

impl State {
    /// `lnet_parse`: a message arrived on NI `ni` from LND peer `from`; the LND finishes it
    /// with [`State::recv_done`] and the token.
    fn recv(&mut self, ni: usize, from: Nid, hdr: &LnetHdr, rdma: bool, work: &mut Work) -> RecvDisposition {
        match self.parse(ni, from, hdr, rdma, work) {
            Parsed::Drop => RecvDisposition::Drop,
            Parsed::Sink { frags, mlength, msg } => {
                RecvDisposition::Sink { frags, mlength, token: self.register(msg) }
            }
            Parsed::Source { frags, msg } => RecvDisposition::Source { frags, token: self.register(msg) },
        }
    }

    /// The checks and the matching of `lnet_parse`, and the message they make (not registered).
    fn parse(&mut self, ni: usize, from: Nid, hdr: &LnetHdr, rdma: bool, work: &mut Work) -> Parsed {
        if self.phase != Phase::Running {
            return Parsed::Drop;
        }
        let rlength = u64::from(hdr.payload_length);
        // First: a message whose source is not the peer it came from is answered nowhere (a
        // drop NAK would go to whatever source it names).
        if from != hdr.src.nid {
            return self.dropped(ni, from, rlength, DropWhy::Routed);
        }
        if !self.is_local(hdr.dest.nid) || hdr.dest.pid != self.pid {
            if let LnetMsg::Put(p) = hdr.msg {
                if self.is_local(hdr.dest.nid) && !rdma && !p.ack_wmd.is_none() {
                    // Our NID, another process: the drop NAK, as for a PUT that matched nothing
                    // (an initiator waiting for the ACK learns of the drop).
                    let me = ProcessId::new(hdr.dest.nid, self.pid);
                    let ack = AckTo {
                        to: hdr.src,
                        me,
                        wmd: p.ack_wmd,
                        match_bits: p.match_bits,
                        mlength: DROP_NAK_MLENGTH,
                    };
                    self.send_ack(ni, ack, work);
                }
            }
            return self.dropped(ni, from, rlength, DropWhy::NotForMe);
        }
        match hdr.msg {
            LnetMsg::Put(p) => self.recv_put(ni, from, hdr, p, rdma, work),
            LnetMsg::Get(g) => self.recv_get(ni, from, hdr, g, rdma, work),
            LnetMsg::Ack(a) => self.recv_ack(ni, from, hdr, a, work),
            LnetMsg::Reply(r) => self.recv_reply(ni, from, hdr, r, work),
            LnetMsg::Hello(_) => self.dropped(ni, from, rlength, DropWhy::BadType),
        }
    }

    /// Counts a drop on the NI and the peer.
    pub(super) fn dropped(&mut self, ni: usize, from: Nid, bytes: u64, why: DropWhy) -> Parsed {
        if let Some(n) = self.nis.get_mut(ni) {
            let d = &mut n.drops;
            match why {
                DropWhy::Match(DropReason::NoMatch) => d.no_match += 1,
                DropWhy::Match(DropReason::TooLong { .. }) => d.too_long += 1,
                DropWhy::Match(DropReason::BadPortal) => d.bad_portal += 1,
                DropWhy::NotForMe => d.not_for_me += 1,
                DropWhy::Routed => d.routed += 1,
                DropWhy::Unexpected => d.unexpected += 1,
                DropWhy::BadType => d.bad_type += 1,
                DropWhy::LazyFull => d.lazy_full += 1,
                DropWhy::LazyDiscarded => d.lazy_discarded += 1,
            }
            n.counters.drop_count += 1;
            n.counters.drop_bytes += bytes;
            let p = n.peer_mut(from);
            p.counters.drop_count += 1;
            p.counters.drop_bytes += bytes;
        }
        Parsed::Drop
    }

    /// Counts an accepted incoming message.
    pub(super) fn accepted(&mut self, ni: usize, from: Nid) {
        if let Some(n) = self.nis.get_mut(ni) {
            n.counters.recv_count += 1;
            n.peer_mut(from).counters.recv_count += 1;
        }
    }

    /// An incoming message, not registered yet.
    pub(super) fn new_recv(ni: usize, from: Nid, kind: MsgKind) -> Msg {
        Msg { ni, peer: from, credit: CreditState::None, queued: None, kind }
    }

    /// Registers an incoming message the LND finishes later, and returns its token.
    fn register(&mut self, msg: Msg) -> u64 {
        let token = self.new_token();
        self.msgs.insert(token, msg);
        token
    }

    fn recv_put(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: &LnetHdr,
        p: PutMsg,
        rdma: bool,
        work: &mut Work,
    ) -> Parsed {
        let rlength = u64::from(hdr.payload_length);
        let matched = self.table.match_put(hdr.src, p.ptl_index, p.match_bits, rlength, u64::from(p.offset));
        match matched {
            MatchResult::Matched(m) => self.accept_put(ni, from, hdr, p, rdma, m),
            // A lazy portal keeps it until a match entry takes it (`super::lazy`).
            MatchResult::Dropped(DropReason::NoMatch) if self.lazy.is_lazy(p.ptl_index) => {
                match self.delay_put(ni, from, hdr, p, rdma) {
                    Ok(parsed) => parsed,
                    Err(why) => self.drop_put(ni, from, hdr, p, rdma, why, work),
                }
            }
            MatchResult::Dropped(reason) => {
                self.drop_put(ni, from, hdr, p, rdma, DropWhy::Match(reason), work)
            }
        }
    }

    /// Drops an incoming PUT for `why` and counts it; a small PUT (not `rdma`) that asked for
    /// an ACK gets lnet-shim's drop NAK, so the initiator learns its PUT went nowhere (an RDMA
    /// PUT's initiator hears it from the LND).
    #[allow(clippy::too_many_arguments, reason = "the PUT and where it came from")]
    pub(super) fn drop_put(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: &LnetHdr,
        p: PutMsg,
        rdma: bool,
        why: DropWhy,
        work: &mut Work,
    ) -> Parsed {
        if !rdma && !p.ack_wmd.is_none() {
            let ack = AckTo {
                to: hdr.src,
                me: hdr.dest,
                wmd: p.ack_wmd,
                match_bits: p.match_bits,
                mlength: DROP_NAK_MLENGTH,
            };
            self.send_ack(ni, ack, work);
        }
        self.dropped(ni, from, u64::from(hdr.payload_length), why)
    }

    /// An incoming PUT that matched `m`: its sink in the MD and the message that finishes it
    /// (the PUT event, the ACK).
    #[inline(always)]
    pub(super) fn accept_put(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: &LnetHdr,
        p: PutMsg,
        rdma: bool,
        m: Matched,
    ) -> Parsed {
        let rlength = u64::from(hdr.payload_length);
        let id = m.user_ptr;
        let Some(rec) = self.mds.get_mut(&id) else {
            return self.dropped(ni, from, rlength, DropWhy::Match(DropReason::NoMatch));
        };
        rec.refs += 1;
        if m.unlinked {
            rec.unlinked = true;
        }
        let frags = slice_frags(&rec.frags, m.offset, m.mlength);
        let template = event_template(
            EventKind::Put,
            hdr.src,
            hdr.dest,
            p.ptl_index,
            p.match_bits,
            rlength,
            m.mlength,
            m.offset,
            p.hdr_data,
            hdr,
        );
        let ack = (!p.ack_wmd.is_none() && !m.options.contains(MdOptions::ACK_DISABLE)).then_some(AckTo {
            to: hdr.src,
            me: hdr.dest,
            wmd: p.ack_wmd,
            match_bits: p.match_bits,
            mlength: m.mlength as u32,
        });
        self.accepted(ni, from);
        let msg = State::new_recv(ni, from, MsgKind::RecvPut { md: id, template, ack, rdma });
        Parsed::Sink { frags, mlength: m.mlength as usize, msg }
    }

    fn recv_get(
        &mut self,
        ni: usize,
        from: Nid,
        hdr: &LnetHdr,
        g: GetMsg,
        rdma: bool,
        _work: &mut Work,
    ) -> Parsed {
        let rlength = u64::from(g.sink_length);
        let matched =
            self.table.match_get(hdr.src, g.ptl_index, g.match_bits, rlength, u64::from(g.src_offset));
        let m = match matched {
            MatchResult::Matched(m) => m,
            // An RDMA GET is answered GET_DONE(-ENODATA) by the LND; a header-only one (from a
            // kernel peer) is dropped silently, as LNet does.
            MatchResult::Dropped(reason) => return self.dropped(ni, from, 0, DropWhy::Match(reason)),
        };
        let id = m.user_ptr;
        let Some(rec) = self.mds.get_mut(&id) else {
            return self.dropped(ni, from, 0, DropWhy::Match(DropReason::NoMatch));
        };
        rec.refs += 1;
        if m.unlinked {
            rec.unlinked = true;
        }
        let frags = slice_frags(&rec.frags, m.offset, m.mlength);
        let template = event_template(
            EventKind::Get,
            hdr.src,
            hdr.dest,
            g.ptl_index,
            g.match_bits,
            rlength,
            m.mlength,
            m.offset,
            0,
            hdr,
        );
        let reply = (!rdma).then(|| {
            Box::new(ReplyTo { to: hdr.src, me: hdr.dest, wmd: g.return_wmd, frags: frags.clone() })
        });
        self.accepted(ni, from);
        let msg = State::new_recv(ni, from, MsgKind::RecvGet { md: id, template, reply });
        Parsed::Source { frags, msg }
    }

    fn recv_ack(&mut self, ni: usize, from: Nid, hdr: &LnetHdr, a: AckMsg, work: &mut Work) -> Parsed {
        let pending = self.take_pending_for_wire(a.dst_wmd, EventKind::Ack, from, Some(a.match_bits));
        let Some((id, p)) = pending else {
            return self.dropped(ni, from, 0, DropWhy::Unexpected);
        };
        self.accepted(ni, from);
        let mut t = p.template;
        t.initiator = hdr.dest;
        t.target = hdr.src;
        let status = if a.mlength == DROP_NAK_MLENGTH {
            t.mlength = 0;
            Err(Errno::ENODATA)
        } else {
            t.mlength = u64::from(a.mlength);
            Ok(())
        };
        self.response_event(id, p.op, EventKind::Ack, &t, status, work);
        // Nothing to receive: the ACK is complete.
        Parsed::Drop
    }

    fn recv_reply(&mut self, ni: usize, from: Nid, hdr: &LnetHdr, r: ReplyMsg, work: &mut Work) -> Parsed {
        let rlength = u64::from(hdr.payload_length);
        let found =
            self.take_pending_for_wire(r.dst_wmd, EventKind::Reply, from, None).and_then(|(id, p)| {
                let rec = self.mds.get(&id)?;
                Some((id, p, rec.length, rec.options.contains(MdOptions::TRUNCATE)))
            });
        let Some((id, p, length, truncate)) = found else {
            return self.dropped(ni, from, rlength, DropWhy::Unexpected);
        };
        let mut t = p.template;
        t.rlength = rlength;
        if rlength > length && !truncate {
            // LNet drops a REPLY too big for the MD; the GET ends with the error.
            self.response_event(id, p.op, EventKind::Reply, &t, Err(Errno::EMSGSIZE), work);
            return self.dropped(
                ni,
                from,
                rlength,
                DropWhy::Match(DropReason::TooLong {
                    md: crate::matching::MdHandle::from_cookie(id),
                    rlength,
                    available: length,
                }),
            );
        }
        let mlength = rlength.min(length);
        t.mlength = mlength;
        let frags = match self.mds.get(&id) {
            Some(rec) => slice_frags(&rec.frags, 0, mlength),
            None => Frags::new(),
        };
        self.accepted(ni, from);
        // The response's reference moves to the receive.
        let msg = State::new_recv(ni, from, MsgKind::RecvReply { md: id, template: t, op: p.op });
        Parsed::Sink { frags, mlength: mlength as usize, msg }
    }

    /// `lnet_finalize` of a receive: the LND finished moving the data of receive `token`.
    pub(super) fn recv_done(&mut self, token: u64, result: Result<usize, LndError>, work: &mut Work) {
        let Some(msg) = self.msgs.get(&token) else { return };
        if msg.kind.is_send() {
            return; // an LND reporting a send token as a receive: ignore
        }
        let Some(msg) = self.msgs.remove(&token) else { return };
        self.finish_recv(msg, result, work);
    }

    /// The rest of `lnet_finalize` for a receive: its counters, events and response.
    pub(super) fn finish_recv(&mut self, msg: Msg, result: Result<usize, LndError>, work: &mut Work) {
        if let MsgKind::RecvDelayed { portal, id } = msg.kind {
            // A lazy portal's copy of a PUT is in (or failed): not a delivery yet.
            self.delayed_arrived(portal, id, result, work);
            return;
        }
        let (ni, peer) = (msg.ni, msg.peer);
        if let Some(n) = self.nis.get_mut(ni) {
            let p = n.peer_mut(peer);
            match result {
                Ok(bytes) => {
                    p.counters.recv_bytes += bytes as u64;
                    n.counters.recv_bytes += bytes as u64;
                }
                Err(_) => {
                    p.counters.recv_errors += 1;
                    n.counters.recv_errors += 1;
                }
            }
        }
        let status = result.map(|_| ()).map_err(|e| e.errno);
        match msg.kind {
            MsgKind::RecvPut { md, template, ack, rdma } => {
                self.md_event(md, EventKind::Put, &template, status, true, work);
                match (ack, status) {
                    (Some(ack), Ok(())) => self.send_ack(ni, ack, work),
                    // A small PUT that failed after matching: the initiator believes it
                    // delivered, so tell it (an RDMA PUT's failure reaches it through the LND).
                    (Some(ack), Err(_)) if !rdma => {
                        self.send_ack(ni, AckTo { mlength: DROP_NAK_MLENGTH, ..ack }, work)
                    }
                    _ => {}
                }
            }
            MsgKind::RecvGet { md, template, reply } => match (reply, status) {
                (Some(reply), Ok(())) if self.phase == Phase::Running => {
                    self.send_reply(ni, md, template, *reply, work)
                }
                // Shutting down: the REPLY is not sent, so the GET was not served (the kernel's
                // `lnet_send` is `-ESHUTDOWN` then, and `lnet_parse_get` ends the GET with it).
                (Some(_), Ok(())) => {
                    self.md_event(md, EventKind::Get, &template, Err(Errno::ESHUTDOWN), true, work)
                }
                _ => self.md_event(md, EventKind::Get, &template, status, true, work),
            },
            MsgKind::RecvReply { md, template, op } => {
                let mut t = template;
                if let Ok(n) = result {
                    t.mlength = n as u64;
                }
                self.response_event(md, op, EventKind::Reply, &t, status, work);
            }
            MsgKind::Put { .. }
            | MsgKind::Get { .. }
            | MsgKind::Ack
            | MsgKind::Reply { .. }
            | MsgKind::RecvDelayed { .. } => {}
        }
    }
}
