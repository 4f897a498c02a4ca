//! Receiving (`kiblnd_handle_rx`, `kiblnd_recv`): unpack, per-connection checks, credits,
//! dispatch by type, and reposting the buffer with the per-type credit rule.
//!
//! | message | handling | repost |
//! |---|---|---|
//! | NOOP | credits only | no credit |
//! | IMMEDIATE | LNet decides; payload copied into its sink | peer credit |
//! | PUT_REQ | LNet decides; PUT_ACK with the sink's descriptor, or PUT_NAK | no credit if ACKed (the PUT_DONE returns it), else peer credit |
//! | PUT_ACK | RDMA WRITE the data, then PUT_DONE on the same descriptor | reserved credit |
//! | PUT_NAK | the PUT ends with the peer's status | reserved credit |
//! | PUT_DONE | the sink's receive ends | peer credit |
//! | GET_REQ | LNet gives the source; RDMA WRITE into the requester's sink, GET_DONE | peer credit |
//! | GET_DONE | the GET ends; the reply length is known | reserved credit |
//!
//! Anything malformed, a wrong NID or stamp, a credit overflow, an unknown cookie or an
//! unexpected type closes the connection (`-EPROTO` / `-ESTALE`); nothing is written outside
//! the buffers LNet named.

use lnet_shim::event::Errno;
use lnet_shim::hdr::LnetHdr;
use lnet_shim::lnd::{Health, LndError, RecvDisposition, frags_len};

use super::send::{RdmaSetupError, plan_rdma};
use super::tx::Upper;
use super::{Engine, Waiting, err};
use crate::credits::{RxRepost, TxClass};
use crate::fabric::{Device, QueuePair};
use crate::time::Instant;
use crate::wire::{ConnIdentity, IBLND_MSG_SIZE, MsgBody, MsgType, RdmaDesc, RdmaFrag, check_conn, unpack};

/// What to do with the receive buffer after the message is handled.
enum After {
    Repost(RxRepost),
    /// Keep the buffer: the message waits for a descriptor (retried from `waiting`).
    Defer,
    /// The connection was closed.
    Closed,
}

fn proto() -> LndError {
    err(Errno::EPROTO, Health::RemoteError)
}

impl<D: Device> Engine<D> {
    /// Handles receive buffer `rx` of connection `key`, holding `len` bytes.
    pub(super) fn handle_rx(&mut self, now: Instant, key: usize, rx: u32, len: u32) {
        let Some(conn) = self.conns.get(key) else { return };
        let generation = conn.generation;
        let mut buf = std::mem::take(&mut self.scratch);
        buf.resize(IBLND_MSG_SIZE, 0);
        let n = (len as usize).min(IBLND_MSG_SIZE);
        let read = conn.rx.buf().read(rx as usize * IBLND_MSG_SIZE, buf.get_mut(..n).unwrap_or_default());
        let after = match read {
            Ok(()) => self.dispatch(now, key, rx, len, buf.get(..n).unwrap_or_default()),
            Err(_) => After::Closed,
        };
        self.scratch = buf;
        match after {
            After::Repost(rule) => {
                let Some(conn) = self.conns.get_mut(key) else { return };
                if conn.post_rx(key, rx).is_err() {
                    self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
                    return;
                }
                conn.credits.rx_reposted(rule);
                self.dirty.insert(key);
                self.take_early_sends(now);
            }
            After::Defer => self.waiting.push_back(Waiting::Rx(key, generation, rx, len)),
            After::Closed => {}
        }
    }

    fn close_for(&mut self, now: Instant, key: usize, e: LndError) -> After {
        match e.errno {
            Errno::EPROTO => self.stats.protocol_errors += 1,
            Errno::ESTALE => self.stats.stale_msgs += 1,
            _ => {}
        }
        self.close_conn(now, key, e);
        After::Closed
    }

    fn dispatch(&mut self, now: Instant, key: usize, rx: u32, len: u32, bytes: &[u8]) -> After {
        let Ok(msg) = unpack(bytes) else { return self.close_for(now, key, proto()) };
        let no_slot = self.slots.available() == 0;
        let Some(conn) = self.conns.get_mut(key) else { return After::Closed };
        let ident = ConnIdentity {
            peer_nid: conn.peer,
            peer_incarnation: conn.peer_incarnation,
            my_nid: self.cfg.nid,
            my_incarnation: self.cfg.incarnation,
        };
        if check_conn(&msg.hdr, &ident).is_err() {
            return self.close_for(now, key, err(Errno::ESTALE, Health::RemoteError));
        }
        // A request whose answer needs a descriptor waits for one before anything in it is
        // taken into account: it is dispatched again, whole, when a descriptor frees.
        let needs_tx = matches!(msg.body, MsgBody::PutReq(_) | MsgBody::GetReq(_));
        if needs_tx && no_slot {
            return After::Defer;
        }
        if conn.credits.credits_returned(u32::from(msg.hdr.credits)).is_err() {
            return self.close_for(now, key, proto());
        }
        self.stats.rx_msgs += 1;
        self.stats.rx_bytes += u64::from(len);
        let _ = rx;
        let peer = conn.peer;
        match msg.body {
            MsgBody::Noop => After::Repost(RxRepost::NoCredit),
            MsgBody::Immediate(m) => {
                let Ok(hdr) = LnetHdr::decode(m.lnet_hdr) else { return self.close_for(now, key, proto()) };
                // Matched, copied into its sink and finished in one call (a GET that travelled
                // as IMMEDIATE has no RDMA sink: LNet replies itself).
                self.upcalls.recv_immediate(peer, &hdr, m.payload);
                After::Repost(RxRepost::PeerCredit)
            }
            MsgBody::PutReq(m) => {
                let Ok(hdr) = LnetHdr::decode(m.lnet_hdr) else { return self.close_for(now, key, proto()) };
                let disp = self.upcalls.recv(peer, &hdr, true);
                self.answer_put_req(now, key, m.cookie, disp)
            }
            MsgBody::PutAck(m) => {
                let Some(txk) = self.waiting_tx(key, m.src_cookie, MsgType::PutReq) else {
                    return self.close_for(now, key, proto());
                };
                self.put_ack_received(now, key, txk, m.dst_cookie, m.rd);
                After::Repost(RxRepost::ReservedCredit)
            }
            MsgBody::PutNak(c) => {
                let Some(txk) = self.waiting_tx(key, c.cookie, MsgType::PutReq) else {
                    return self.close_for(now, key, proto());
                };
                self.finish_waiting(txk, c.status, false);
                After::Repost(RxRepost::ReservedCredit)
            }
            MsgBody::PutDone(c) => {
                let Some(txk) = self.waiting_tx(key, c.cookie, MsgType::PutAck) else {
                    return self.close_for(now, key, proto());
                };
                self.finish_waiting(txk, c.status, false);
                After::Repost(RxRepost::PeerCredit)
            }
            MsgBody::GetReq(m) => {
                let Ok(hdr) = LnetHdr::decode(m.lnet_hdr) else { return self.close_for(now, key, proto()) };
                let disp = self.upcalls.recv(peer, &hdr, true);
                self.answer_get_req(now, key, m.cookie, m.rd, disp);
                After::Repost(RxRepost::PeerCredit)
            }
            MsgBody::GetDone(c) => {
                let Some(txk) = self.waiting_tx(key, c.cookie, MsgType::GetReq) else {
                    return self.close_for(now, key, proto());
                };
                self.finish_waiting(txk, c.status, true);
                After::Repost(RxRepost::ReservedCredit)
            }
            MsgBody::ConnReq(_) | MsgBody::ConnAck(_) => self.close_for(now, key, proto()),
        }
    }

    /// The transmit on connection `key` waiting for a reply with `cookie`, sent as `sent`: posted
    /// already (`kiblnd_find_waiting_tx_locked` looks only at the active transmits). A request
    /// still in a credit queue has not reached the peer, so an answer naming it is a lie.
    fn waiting_tx(&self, key: usize, cookie: u64, sent: MsgType) -> Option<usize> {
        let txk = *self.cookies.get(&cookie)?;
        let t = self.txs.get(txk)?;
        (t.conn == Some(key) && t.waiting && !t.queued && t.msg_type == sent).then_some(txk)
    }

    /// The peer's answer ended a waiting transmit: `status` bytes or `-errno`. The answer is
    /// the outcome: the peer had our message, so nothing after it (a flushed SEND, the
    /// connection closing) can turn a success into a failure.
    fn finish_waiting(&mut self, txk: usize, status: i32, is_get: bool) {
        if let Some(t) = self.txs.get_mut(txk) {
            t.waiting = false;
            // A GET_DONE claiming more bytes than the sink holds cannot be true: the WRITEs
            // were checked against the sink's registration, so the peer lies about the length.
            let too_long =
                is_get && status > 0 && frags_len(&t.pinned).is_some_and(|sink| status as usize > sink);
            if too_long {
                self.stats.protocol_errors += 1;
                t.fail(err(Errno::EPROTO, Health::RemoteError));
            } else if status < 0 {
                t.fail(err(Errno::from_raw(status).unwrap_or(Errno::EIO), Health::RemoteError));
            } else if is_get {
                t.reply_len = Some(status as usize);
                t.status = Ok(status as usize);
            }
            t.answered = true;
        }
        self.tx_maybe_done(txk);
    }

    /// Queues a completion-type message (PUT_NAK, PUT_ACK, GET_DONE) as a new transmit.
    fn reply_tx(&mut self, now: Instant, key: usize, msg_type: MsgType, upper: Upper) -> Option<usize> {
        let peer = self.conns.get(key)?.peer;
        let txk = self.new_tx(now, peer, msg_type, upper)?;
        if let Some(t) = self.txs.get_mut(txk) {
            t.class = TxClass::NoCredit;
        }
        Some(txk)
    }

    fn answer_put_req(&mut self, now: Instant, key: usize, cookie: u64, disp: RecvDisposition) -> After {
        let (frags, mlength, token) = match disp {
            RecvDisposition::Sink { frags, mlength, token } => (frags, mlength, token),
            RecvDisposition::Source { token, .. } => {
                // A GET header in a PUT_REQ (LNet accepted it as a GET to answer): nothing can
                // sink the data. End the receive LNet holds for it, and NAK the source.
                self.upcalls.recv_done(token, Err(err(Errno::EINVAL, Health::LocalError)));
                self.send_completion(now, key, MsgType::PutNak, cookie, Errno::ENODATA.as_i32(), Upper::None);
                return After::Repost(RxRepost::PeerCredit);
            }
            RecvDisposition::Drop => {
                // Nothing wants the data: tell the source it matched nothing.
                self.send_completion(now, key, MsgType::PutNak, cookie, Errno::ENODATA.as_i32(), Upper::None);
                return After::Repost(RxRepost::PeerCredit);
            }
        };
        if mlength == 0 {
            self.send_completion(now, key, MsgType::PutNak, cookie, 0, Upper::None);
            self.upcalls.recv_done(token, Ok(0));
            return After::Repost(RxRepost::PeerCredit);
        }
        let rd = self.sink_rd(&frags, mlength);
        let Some(txk) = self.reply_tx(now, key, MsgType::PutAck, Upper::Recv(token)) else {
            // Cannot happen: a slot was checked before the upcall.
            self.upcalls.recv_done(token, Err(err(Errno::ENOMEM, Health::LocalError)));
            return After::Repost(RxRepost::PeerCredit);
        };
        match rd {
            Ok(rd) => {
                let my_cookie = self.alloc_cookie();
                let nob = self.init_body(txk, |buf| {
                    crate::wire::init_putack(buf, cookie, my_cookie, rd.key, &rd.frags)
                });
                self.cookies.insert(my_cookie, txk);
                self.set_nob(txk, nob);
                if let Some(t) = self.txs.get_mut(txk) {
                    t.cookie = my_cookie;
                    t.waiting = true;
                    t.sink_reg = rd.reg;
                    t.pinned = frags;
                    t.status = Ok(mlength);
                }
                self.queue_on_conn(key, txk);
                After::Repost(RxRepost::NoCredit)
            }
            Err(e) => {
                // The sink cannot be described: NAK the source, fail the receive.
                let nob =
                    self.init_body(txk, |buf| crate::wire::init_completion(buf, cookie, e.errno.as_i32()));
                self.set_nob(txk, nob);
                if let Some(t) = self.txs.get_mut(txk) {
                    t.msg_type = MsgType::PutNak;
                    t.status = Err(e);
                }
                self.queue_on_conn(key, txk);
                After::Repost(RxRepost::PeerCredit)
            }
        }
    }

    /// Sends a PUT_NAK / PUT_DONE / GET_DONE with `status` for `cookie`.
    fn send_completion(
        &mut self,
        now: Instant,
        key: usize,
        t: MsgType,
        cookie: u64,
        status: i32,
        upper: Upper,
    ) {
        let Some(txk) = self.reply_tx(now, key, t, upper) else {
            if let Upper::Recv(token) = upper {
                self.upcalls.recv_done(token, Err(err(Errno::ENOMEM, Health::LocalError)));
            }
            return;
        };
        let nob = self.init_body(txk, |buf| crate::wire::init_completion(buf, cookie, status));
        self.set_nob(txk, nob);
        if status < 0 {
            if let Some(tx) = self.txs.get_mut(txk) {
                tx.status = Err(err(Errno::from_raw(status).unwrap_or(Errno::EIO), Health::RemoteError));
            }
        }
        self.queue_on_conn(key, txk);
    }

    /// The sink answered our PUT_REQ: RDMA WRITE the payload, then PUT_DONE reusing the
    /// descriptor (if the transfer cannot be set up, only a PUT_DONE with the error).
    ///
    /// As much moves as the sink describes (`kiblnd_rd_size` of the PUT_ACK's descriptor): the
    /// bytes its MD matched, fewer than the payload when the MD truncates. A sink describing
    /// more than the payload is a protocol error (o2iblnd: "Src buffer exhausted").
    fn put_ack_received(&mut self, now: Instant, key: usize, txk: usize, dst_cookie: u64, rd: RdmaDesc<'_>) {
        let dst: Vec<RdmaFrag> = rd.iter().collect();
        let (wrq_sge, max_frags) = (self.wrq_sge_of(key), self.max_frags_of(key));
        let Some(t) = self.txs.get_mut(txk) else { return };
        let payload = t.source.iter().map(|s| u64::from(s.length)).sum::<u64>();
        let plan = match rd.size().map(u64::from) {
            Some(nob) if nob <= payload => {
                plan_rdma(&t.source, rd.key(), &dst, nob, wrq_sge, max_frags).map(|wrs| (wrs, nob))
            }
            _ => Err(RdmaSetupError::SourceTooSmall),
        };
        let status = match plan {
            Ok((wrs, nob)) => {
                t.rdma = wrs;
                i32::try_from(nob).unwrap_or(i32::MAX)
            }
            Err(e) => {
                let (errno, health) = match e {
                    RdmaSetupError::TooManyFragments => (Errno::EMSGSIZE, Health::LocalError),
                    RdmaSetupError::SinkTooSmall => (Errno::EINVAL, Health::LocalError),
                    RdmaSetupError::SourceTooSmall => {
                        self.stats.protocol_errors += 1;
                        (Errno::EPROTO, Health::RemoteError)
                    }
                };
                t.fail(err(errno, health));
                errno.as_i32()
            }
        };
        t.waiting = false;
        t.msg_type = MsgType::PutDone;
        t.class = TxClass::NoCredit;
        self.set_deadline(now, txk);
        let nob = self.init_body(txk, |buf| crate::wire::init_completion(buf, dst_cookie, status));
        self.set_nob(txk, nob);
        self.queue_on_conn(key, txk);
    }

    /// A GET_REQ arrived: write LNet's source into the requester's sink, then GET_DONE.
    fn answer_get_req(
        &mut self,
        now: Instant,
        key: usize,
        cookie: u64,
        rd: RdmaDesc<'_>,
        disp: RecvDisposition,
    ) {
        let (frags, token) = match disp {
            RecvDisposition::Source { frags, token } => (frags, token),
            RecvDisposition::Sink { token, .. } => {
                self.upcalls.recv_done(token, Err(err(Errno::EINVAL, Health::LocalError)));
                self.send_completion(
                    now,
                    key,
                    MsgType::GetDone,
                    cookie,
                    Errno::ENODATA.as_i32(),
                    Upper::None,
                );
                return;
            }
            RecvDisposition::Drop => {
                self.send_completion(
                    now,
                    key,
                    MsgType::GetDone,
                    cookie,
                    Errno::ENODATA.as_i32(),
                    Upper::None,
                );
                return;
            }
        };
        let src = match self.local_sges(&frags) {
            Ok(s) => s,
            Err(e) => {
                self.send_completion(
                    now,
                    key,
                    MsgType::GetDone,
                    cookie,
                    e.errno.as_i32(),
                    Upper::Recv(token),
                );
                return;
            }
        };
        let dst: Vec<RdmaFrag> = rd.iter().collect();
        let sink = rd.size().map_or(0, u64::from);
        let nob = src.iter().map(|s| u64::from(s.length)).sum::<u64>().min(sink);
        let plan = plan_rdma(&src, rd.key(), &dst, nob, self.wrq_sge_of(key), self.max_frags_of(key));
        match plan {
            Ok(wrs) => {
                let Some(txk) = self.reply_tx(now, key, MsgType::GetDone, Upper::Recv(token)) else {
                    self.upcalls.recv_done(token, Err(err(Errno::ENOMEM, Health::LocalError)));
                    return;
                };
                let status = i32::try_from(nob).unwrap_or(i32::MAX);
                let msg_nob = self.init_body(txk, |buf| crate::wire::init_completion(buf, cookie, status));
                self.set_nob(txk, msg_nob);
                if let Some(t) = self.txs.get_mut(txk) {
                    t.rdma = wrs;
                    t.pinned = frags;
                    t.status = Ok(nob as usize);
                }
                self.queue_on_conn(key, txk);
            }
            Err(e) => {
                let errno =
                    if e == RdmaSetupError::TooManyFragments { Errno::EMSGSIZE } else { Errno::EINVAL };
                // The peer gets the error in its GET_DONE; LNet's receive fails with it too.
                self.send_completion(now, key, MsgType::GetDone, cookie, errno.as_i32(), Upper::Recv(token));
            }
        }
    }

    /// SGEs per RDMA WRITE: `wrq_sge`, or fewer if the device gave the QP fewer (it clamps the
    /// request to its `max_sge`; a WR with more would be refused and close the connection).
    fn wrq_sge_of(&self, key: usize) -> usize {
        let tunable = self.cfg.tunables.wrq_sge;
        let sge = self.conns.get(key).map_or(tunable, |c| tunable.min(c.qp.caps().max_send_sge));
        sge.max(1) as usize
    }

    fn max_frags_of(&self, key: usize) -> usize {
        self.conns.get(key).map_or(crate::wire::IBLND_MAX_RDMA_FRAGS, |c| usize::from(c.max_frags))
    }
}
