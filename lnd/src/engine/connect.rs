//! Connection establishment on the CM (`kiblnd_connect_peer`, `kiblnd_passive_connect`,
//! `kiblnd_check_connreply`, `kiblnd_rejected`).
//!
//! Active: create the CQ and QP (shrinking Q if the device is short of resources), post the
//! receives, send a REQ whose private data is the CONNREQ; on the REP check the CONNACK, move
//! the QP to RTR/RTS with the peer's QPN and start PSN, send the RTU. Passive: check the CONNREQ
//! in o2iblnd's order, create the connection with the requester's queue depth (or less), move
//! the QP to RTR/RTS, reply with a CONNACK; established on the RTU, on COMM_EST, or on the first
//! message received (which only a peer that got the REP can send: a lost RTU delays nothing).
//!
//! PSNs follow seed 000: each side's start PSN travels in its REQ/REP and the peer adopts it as
//! its receive queue's expected PSN.

use lnet_shim::event::Errno;
use lnet_shim::lnd::{Health, LndError};
use lnet_shim::nid::Nid;

use super::conn::{ConnSpec, ConnState, create, established};
use super::peer::{MAX_CONN_RACES, Peer, nidhash};
use super::{Engine, err};
use crate::cm::ip_cm::CmaHeader;
use crate::cm::mad::RejReason;
use crate::cm::manager::{CmEvent, ConnId, ConnectParams};
use crate::credits::Credits;
use crate::fabric::{CompletionQueue, Device, Mtu, PortAddr, QpModify, QueuePair};
use crate::time::Instant;
use crate::wire::{
    ConnParams, IBLND_CONNPARAMS_LEN, IBLND_MSG_SIZE, IBLND_MSG_VERSION, KibRej, MsgBody, MsgHeader, MsgType,
    RejectReason, unpack,
};

/// Privileged ports are below this.
const PROT_SOCK: u16 = 1024;

/// What the passive side needs from a REQ.
struct PassiveReq {
    from: PortAddr,
    cma: CmaHeader,
    remote_qpn: u32,
    remote_psn: u32,
    path_mtu: Mtu,
}

impl<D: Device> Engine<D> {
    fn my_params(&self) -> ConnParams {
        ConnParams {
            queue_depth: self.cfg.tunables.peer_credits.min(255) as u16,
            max_frags: self.cfg.max_frags,
            max_msg_size: IBLND_MSG_SIZE as u32,
        }
    }

    fn path_mtu(&self) -> Mtu {
        let port = self.dev.query_port().active_mtu;
        match self.cfg.tunables.path_mtu().and_then(Mtu::from_bytes) {
            Some(m) => m.min(port),
            None => port,
        }
    }

    /// A CONNREQ or CONNACK as CM private data.
    fn conn_msg(&self, t: MsgType, dst: Nid, dststamp: u64, cp: &ConnParams) -> [u8; IBLND_CONNPARAMS_LEN] {
        let mut buf = [0u8; IBLND_CONNPARAMS_LEN];
        let nob = crate::wire::init_connparams(&mut buf, cp).unwrap_or(0);
        let hdr = MsgHeader {
            version: IBLND_MSG_VERSION,
            msg_type: t,
            credits: 0,
            nob,
            cksum: 0,
            srcnid: self.cfg.nid,
            srcstamp: self.cfg.incarnation,
            dstnid: dst,
            dststamp,
        };
        let _ = crate::wire::pack_header(&mut buf, &hdr, self.cfg.tunables.cksum);
        buf
    }

    fn new_conn(
        &mut self,
        now: Instant,
        peer: Nid,
        q: u32,
        frags: u16,
        active: bool,
    ) -> Result<usize, LndError> {
        let key = self.conns.vacant_key();
        let generation = self.alloc_gen();
        let spec = ConnSpec {
            peer,
            key,
            generation,
            queue_depth: q,
            max_frags: frags,
            wrq_sge: self.cfg.tunables.wrq_sge,
            active,
            my_psn: self.rng.next_u32() & 0x00ff_ffff,
            connect_deadline: now + self.cfg.tunables.connect_timeout(),
        };
        let mut conn =
            create(&self.dev, &self.pd, spec).map_err(|_| err(Errno::ENOMEM, Health::LocalError))?;
        let qpn = conn.qp.qp_num();
        let fd = conn.cq.event_fd();
        let _ = conn.cq.req_notify(false);
        conn.cq_armed = true;
        let k = self.conns.insert(conn);
        self.by_qpn.insert(qpn, k);
        self.by_cq_fd.insert(fd, k);
        self.fd_changes.push(super::FdChange::Add { fd, token: k });
        // Counted from the moment it exists, so that every close (`close_conn_only`) takes
        // back exactly what was added, whatever step of the setup failed.
        if let Some(p) = self.peers.get_mut(&peer) {
            p.conns.push(k);
            if active {
                p.connecting += 1;
            } else {
                p.accepting += 1;
            }
        }
        Ok(k)
    }

    /// Starts connecting to `peer` (`kiblnd_connect_peer`), `conns_per_peer` connections.
    pub(super) fn connect_peer(&mut self, now: Instant, nid: Nid) {
        let q0 = self.cfg.tunables.peer_credits;
        let want = self.cfg.tunables.conns_per_peer.max(1) as usize;
        if let Some(e) = self.link.refusal() {
            // Nothing can connect over a port that is down (a send accepted before it went
            // down, a retry after a rejection).
            self.fail_pending(nid, e);
            return;
        }
        let Some(p) = self.peers.get_mut(&nid) else { return };
        if p.connecting > 0 || p.accepting > 0 {
            return;
        }
        p.reconnect_at = None;
        let (q, frags, stamp) = (p.queue_depth.min(q0), p.max_frags.min(self.cfg.max_frags), p.incarnation);
        let established = established(&self.conns, &p.conns).count();
        let addr = match self.dev.resolve(nid.addr()) {
            Ok(a) => a,
            Err(_) => {
                self.fail_pending_if_unreachable(now, nid, err(Errno::EHOSTUNREACH, Health::LocalError));
                return;
            }
        };
        for _ in 0..want.saturating_sub(established).max(1) {
            if let Err(e) = self.connect_one(now, nid, addr, q, frags, stamp) {
                if let Some(p) = self.peers.get_mut(&nid) {
                    p.last_error = Some(e);
                }
                self.fail_pending_if_unreachable(now, nid, e);
                return;
            }
        }
    }

    fn connect_one(
        &mut self,
        now: Instant,
        nid: Nid,
        addr: PortAddr,
        q: u32,
        frags: u16,
        stamp: u64,
    ) -> Result<(), LndError> {
        let key = self.new_conn(now, nid, q, frags, true)?;
        let Some(conn) = self.conns.get(key) else { return Err(err(Errno::ENOMEM, Health::LocalError)) };
        // QP sizing may have reduced Q: remember it and ask for no more.
        let q = conn.queue_depth;
        let cp = ConnParams { queue_depth: q as u16, max_frags: frags, max_msg_size: IBLND_MSG_SIZE as u32 };
        let private = self.conn_msg(MsgType::ConnReq, nid, stamp, &cp);
        let src_port = if self.cfg.tunables.use_privileged_port {
            PROT_SOCK - 1 - (self.rng.below(512) as u16)
        } else {
            PROT_SOCK + self.rng.below(60000) as u16
        };
        let params = ConnectParams {
            dest: addr,
            dest_ip: nid.addr(),
            src_port,
            service_id: self.service_id,
            qpn: conn.qp.qp_num(),
            start_psn: conn.my_psn,
            path_mtu: self.path_mtu(),
            retry_count: self.cfg.tunables.retry_count,
            rnr_retry_count: self.cfg.tunables.rnr_retry_count,
            responder_resources: 0,
            initiator_depth: 0,
            local_ack_timeout: self.cfg.qp_ack_timeout,
            private_data: private,
        };
        let id = match self.cm.connect(now, params) {
            Ok(id) => id,
            Err(_) => {
                // The caller fails (or retries) what waits for the peer.
                let e = err(Errno::EINVAL, Health::LocalError);
                self.close_conn_only(now, key, e);
                return Err(e);
            }
        };
        if let Some(c) = self.conns.get_mut(key) {
            c.cm_id = Some(id);
        }
        self.by_cm.insert(id.0, key);
        if let Some(p) = self.peers.get_mut(&nid) {
            p.queue_depth = q;
        }
        Ok(())
    }

    pub(super) fn handle_cm_event(&mut self, now: Instant, ev: CmEvent) {
        match ev {
            CmEvent::ConnectRequest {
                id,
                from,
                cma,
                private_data,
                remote_qpn,
                remote_start_psn,
                path_mtu,
                ..
            } => {
                let req = PassiveReq { from, cma, remote_qpn, remote_psn: remote_start_psn, path_mtu };
                self.passive_connect(now, id, req, &private_data);
            }
            CmEvent::Reply { id, remote_qpn, remote_start_psn, private_data, .. } => {
                self.connect_reply(now, id, remote_qpn, remote_start_psn, &private_data);
            }
            CmEvent::Established { id } => {
                if let Some(key) = self.conn_for_cm(id) {
                    if self.conns.get(key).is_some_and(|c| c.state == ConnState::PassiveWait) {
                        self.established(now, key);
                    }
                }
            }
            CmEvent::Rejected { id, reason, private_data } => {
                self.rejected(now, id, reason, &private_data);
            }
            CmEvent::Unreachable { id } | CmEvent::ReplyTimedOut { id } => {
                if let Some(key) = self.conn_for_cm(id) {
                    self.forget_cm(key);
                    self.connect_failed(now, key, err(Errno::ETIMEDOUT, Health::NetworkTimeout));
                }
            }
            CmEvent::Disconnected { id } => {
                if let Some(key) = self.conn_for_cm(id) {
                    // Messages and ACKs that arrived before the peer's DREQ may still sit in
                    // the CQ: `close_conn` reaps them while the connection is established.
                    // The peer ended a working connection: nothing failed, so the peer is idle
                    // (not `Failed`) until the next send connects again.
                    let hung_up =
                        self.conns.get(key).filter(|c| c.state == ConnState::Established).map(|c| c.peer);
                    self.forget_cm(key);
                    self.close_conn(now, key, err(Errno::ECONNABORTED, Health::RemoteDropped));
                    if let Some(peer) = hung_up {
                        self.forget_failure(peer);
                    }
                }
            }
        }
    }

    /// The CM forgot the id (terminal event): do not disconnect or destroy it again.
    fn forget_cm(&mut self, key: usize) {
        if let Some(c) = self.conns.get_mut(key) {
            if let Some(id) = c.cm_id.take() {
                self.by_cm.remove(&id.0);
            }
        }
    }

    /// A connection attempt failed: close it; with no other attempt left, fail what waits.
    pub(super) fn connect_failed(&mut self, now: Instant, key: usize, e: LndError) {
        self.close_conn(now, key, e);
    }

    fn reject(&mut self, now: Instant, id: ConnId, why: RejectReason) {
        self.stats.accepts_rejected += 1;
        let rej = KibRej::new(IBLND_MSG_VERSION, why, self.cfg.incarnation, self.my_params());
        let _ = self.cm.reject(now, id, RejReason::ConsumerDefined, &rej.encode());
    }

    fn passive_connect(&mut self, now: Instant, id: ConnId, req: PassiveReq, private: &[u8]) {
        let PassiveReq { from, cma, remote_qpn, remote_psn, path_mtu: req_mtu } = req;
        if self.shutdown {
            return self.reject(now, id, RejectReason::Fatal);
        }
        if self.cfg.tunables.require_privileged_port && cma.src_port >= PROT_SOCK {
            return self.reject(now, id, RejectReason::Fatal);
        }
        let Ok(msg) = unpack(private) else { return self.reject(now, id, RejectReason::Fatal) };
        let h = msg.hdr;
        let MsgBody::ConnReq(cp) = msg.body else { return self.reject(now, id, RejectReason::Fatal) };
        if h.version != IBLND_MSG_VERSION {
            return self.reject(now, id, RejectReason::ConnUncompat);
        }
        if h.dstnid != self.cfg.nid || h.srcnid.net() != self.cfg.nid.net() {
            return self.reject(now, id, RejectReason::Fatal);
        }
        if h.srcnid.addr() != cma.src || from.gid.to_ipv4().is_some_and(|ip| ip != h.srcnid.addr()) {
            return self.reject(now, id, RejectReason::Fatal);
        }
        let allow = &self.cfg.tunables.accept_nids;
        if !allow.is_empty() && !allow.contains(&h.srcnid) {
            // o2iblnd refuses an unwanted peer (wrong NID, unprivileged port) with FATAL.
            self.stats.accepts_refused_nid += 1;
            return self.reject(now, id, RejectReason::Fatal);
        }
        if h.dststamp != 0 && h.dststamp != self.cfg.incarnation {
            return self.reject(now, id, RejectReason::ConnStale);
        }
        if u32::from(cp.queue_depth) > self.cfg.tunables.peer_credits || cp.queue_depth == 0 {
            return self.reject(now, id, RejectReason::MsgQueueSize);
        }
        if cp.max_frags > self.cfg.max_frags || cp.max_frags == 0 {
            return self.reject(now, id, RejectReason::RdmaFrags);
        }
        if cp.max_msg_size as usize > IBLND_MSG_SIZE {
            return self.reject(now, id, RejectReason::Fatal);
        }
        let nid = h.srcnid;
        let q0 = self.cfg.tunables.peer_credits;
        let me = self.cfg.nid;
        let p = self.peers.entry(nid).or_insert_with(|| Peer::new(nid, q0));
        if p.incarnation != 0 && p.incarnation != h.srcstamp {
            // A restarted peer: drop the connections we had with its old incarnation
            // (`kiblnd_close_stale_conns_locked`). Not our own attempt in flight: the new peer
            // rejects it as stale, and that reject retries it while sends wait for the peer
            // (closing it here failed them, with no attempt left).
            p.incarnation = h.srcstamp;
            let old: Vec<usize> = p
                .conns
                .iter()
                .copied()
                .filter(|&k| self.conns.get(k).is_some_and(|c| c.state != ConnState::ActiveConnect))
                .collect();
            for k in old {
                self.close_conn(now, k, err(Errno::ESTALE, Health::RemoteDropped));
            }
            return self.reject(now, id, RejectReason::ConnStale);
        }
        p.incarnation = h.srcstamp;
        // A race with our own attempt: the higher NID hash wins; after too many races the lower
        // one is let through (LU-7646).
        if p.connecting > 0 && nidhash(nid) < nidhash(me) && p.races < MAX_CONN_RACES {
            p.races += 1;
            return self.reject(now, id, RejectReason::ConnRace);
        }
        let key = match self.new_conn(now, nid, u32::from(cp.queue_depth), cp.max_frags, false) {
            Ok(k) => k,
            Err(_) => return self.reject(now, id, RejectReason::NoResources),
        };
        // The REQ's path MTU is the active side's (its port's, or its `ib_mtu`): never send
        // larger packets than it takes (Linux's passive side takes the REQ's too).
        let mtu = self.path_mtu().min(req_mtu);
        let (timeout, retry, rnr, min_rnr) = (
            self.cfg.qp_ack_timeout,
            self.cfg.tunables.retry_count,
            self.cfg.tunables.rnr_retry_count,
            self.cfg.min_rnr_timer,
        );
        let Some(conn) = self.conns.get_mut(key) else { return };
        conn.cm_id = Some(id);
        conn.peer_incarnation = h.srcstamp;
        conn.remote_qpn = remote_qpn;
        let steps = [
            QpModify::Rtr {
                path_mtu: mtu,
                dest_qpn: remote_qpn,
                rq_psn: remote_psn,
                dest: from,
                max_dest_rd_atomic: 0,
                min_rnr_timer: min_rnr,
            },
            QpModify::Rts {
                sq_psn: conn.my_psn,
                timeout,
                retry_cnt: retry,
                rnr_retry: rnr,
                max_rd_atomic: 0,
            },
        ];
        let ok = steps.iter().all(|m| conn.qp.modify(m).is_ok());
        let (qpn, psn, q) = (conn.qp.qp_num(), conn.my_psn, conn.queue_depth);
        self.by_cm.insert(id.0, key);
        if !ok {
            self.reject(now, id, RejectReason::NoResources);
            self.forget_cm(key);
            self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
            return;
        }
        let ack = ConnParams {
            queue_depth: q as u16,
            max_frags: cp.max_frags,
            max_msg_size: IBLND_MSG_SIZE as u32,
        };
        let private = self.conn_msg(MsgType::ConnAck, nid, h.srcstamp, &ack);
        if self.cm.accept(now, id, qpn, psn, rnr, &private).is_err() {
            self.forget_cm(key);
            self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
        }
    }

    /// Active side: the peer accepted; check its CONNACK and finish (`kiblnd_check_connreply`).
    fn connect_reply(&mut self, now: Instant, id: ConnId, remote_qpn: u32, remote_psn: u32, private: &[u8]) {
        let Some(key) = self.conn_for_cm(id) else {
            self.cm.destroy(now, id);
            return;
        };
        let Some(conn) = self.conns.get(key).filter(|c| c.state == ConnState::ActiveConnect) else { return };
        let private = private.get(..IBLND_CONNPARAMS_LEN).unwrap_or_default();
        let checked = unpack(private).ok().and_then(|m| match m.body {
            MsgBody::ConnAck(cp)
                if m.hdr.version == IBLND_MSG_VERSION
                    && m.hdr.srcnid == conn.peer
                    && m.hdr.dstnid == self.cfg.nid
                    && m.hdr.dststamp == self.cfg.incarnation
                    && u32::from(cp.queue_depth) <= conn.queue_depth
                    && cp.queue_depth > 0
                    && cp.max_frags <= conn.max_frags
                    && cp.max_frags > 0
                    && cp.max_msg_size as usize <= IBLND_MSG_SIZE =>
            {
                Some((m.hdr.srcstamp, cp))
            }
            _ => None,
        });
        let Some((stamp, cp)) = checked else {
            // o2iblnd: a bad CONNACK is a comms error; the connection is closed at once.
            self.stats.protocol_errors += 1;
            let _ = self.cm.reject(now, id, RejReason::ConsumerDefined, &[]);
            self.forget_cm(key);
            self.connect_failed(now, key, err(Errno::EPROTO, Health::RemoteError));
            return;
        };
        let mtu = self.path_mtu();
        let dest = match self.dev.resolve(conn.peer.addr()) {
            Ok(a) => a,
            Err(_) => return,
        };
        let steps = [
            QpModify::Rtr {
                path_mtu: mtu,
                dest_qpn: remote_qpn,
                rq_psn: remote_psn,
                dest,
                max_dest_rd_atomic: 0,
                min_rnr_timer: self.cfg.min_rnr_timer,
            },
            QpModify::Rts {
                sq_psn: conn.my_psn,
                timeout: self.cfg.qp_ack_timeout,
                retry_cnt: self.cfg.tunables.retry_count,
                rnr_retry: self.cfg.tunables.rnr_retry_count,
                max_rd_atomic: 0,
            },
        ];
        let ok = steps.iter().all(|m| conn.qp.modify(m).is_ok());
        if !ok || self.cm.complete_connect(now, id).is_err() {
            self.forget_cm(key);
            self.connect_failed(now, key, err(Errno::EIO, Health::LocalError));
            return;
        }
        if let Some(c) = self.conns.get_mut(key) {
            c.peer_incarnation = stamp;
            c.remote_qpn = remote_qpn;
            c.queue_depth = u32::from(cp.queue_depth);
            c.max_frags = cp.max_frags;
        }
        self.established(now, key);
    }

    /// A connection is up (`kiblnd_connreq_done`): credits at Q, waiting transmits move onto it,
    /// early receives are handled, connections to an older incarnation of the peer close.
    fn established(&mut self, now: Instant, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        let q = conn.queue_depth;
        let cs = self.cfg.tunables.concurrent_sends_for(q);
        let hiw = self.cfg.tunables.peer_credits_hiw_for(q);
        conn.credits = Credits::new(q, cs, hiw);
        conn.state = ConnState::Established;
        conn.last_send = now;
        let (peer, active, stamp) = (conn.peer, conn.active, conn.peer_incarnation);
        let early = std::mem::take(&mut conn.early_rx);
        self.stats.conns_established += 1;
        let mut stale = Vec::new();
        let mut pending = Vec::new();
        if let Some(p) = self.peers.get_mut(&peer) {
            if active {
                p.connecting = p.connecting.saturating_sub(1);
            } else {
                p.accepting = p.accepting.saturating_sub(1);
            }
            p.reconnects = 0;
            p.reconnect_at = None;
            p.races = 0;
            p.last_error = None;
            p.incarnation = stamp;
            pending = p.pending.drain(..).collect();
            stale = p.conns.iter().copied().filter(|&k| k != key).collect();
        }
        for k in stale {
            if self
                .conns
                .get(k)
                .is_some_and(|c| c.state == ConnState::Established && c.peer_incarnation != stamp)
            {
                self.close_conn(now, k, err(Errno::ESTALE, Health::RemoteDropped));
            }
        }
        for t in pending {
            self.queue_on_conn(key, t);
            self.set_deadline(now, t);
        }
        for (rx, len) in early {
            // One of them may close the connection (a protocol error): the rest go with it,
            // as the receives of any closed connection do.
            if self.conns.get(key).is_none_or(|c| c.state != ConnState::Established) {
                break;
            }
            self.handle_rx(now, key, rx, len);
        }
        self.dirty.insert(key);
    }

    /// The peer rejected our REQ (`kiblnd_rejected`): maybe retry with what it asked for. A
    /// REJ of our REP (the peer did not take our CONNACK) is a reset: the passive attempt ends
    /// with `-ECONNRESET` and is not retried (o2iblnd's `IBLND_CONN_PASSIVE_WAIT` case); what
    /// waited on it fails unless another attempt is under way.
    fn rejected(&mut self, now: Instant, id: ConnId, reason: RejReason, private: &[u8]) {
        let Some(key) = self.conn_for_cm(id) else { return };
        self.forget_cm(key);
        let Some(conn) = self.conns.get(key) else { return };
        if conn.state == ConnState::PassiveWait {
            self.stats.accepts_reset += 1;
            return self.close_conn(now, key, err(Errno::ECONNRESET, Health::RemoteDropped));
        }
        self.stats.connects_rejected += 1;
        let (peer, q, frags) = (conn.peer, conn.queue_depth, conn.max_frags);
        let rej = KibRej::decode(private).ok();
        let why = rej.and_then(|r| r.reason());
        let mut retry = false;
        let mut e = err(Errno::ECONNREFUSED, Health::RemoteDropped);
        match reason {
            RejReason::InvalidServiceId => {
                // No listener: host unreachable, and no retry (LU-14536). What waits fails now;
                // the next send tries again (o2iblnd hands LNet the error, and LNet's health
                // decides when to send again: holding sends back here made them wait, and a
                // listener that came up meanwhile unreachable, for the connect timeout).
                e = err(Errno::EHOSTUNREACH, Health::NetworkTimeout);
            }
            RejReason::StaleConn => retry = true,
            RejReason::ConsumerDefined => match (why, rej) {
                (Some(RejectReason::ConnRace), _) => retry = true,
                (Some(RejectReason::ConnStale), Some(r)) => {
                    if let (Some(p), Some(inc)) = (self.peers.get_mut(&peer), r.incarnation) {
                        p.incarnation = inc;
                    }
                    e = err(Errno::ESTALE, Health::RemoteDropped);
                    retry = true;
                }
                (Some(RejectReason::MsgQueueSize), Some(r)) => {
                    if let Some(cp) = r.cp.filter(|cp| u32::from(cp.queue_depth) < q && cp.queue_depth > 0) {
                        if let Some(p) = self.peers.get_mut(&peer) {
                            p.queue_depth = u32::from(cp.queue_depth);
                        }
                        retry = true;
                    }
                }
                (Some(RejectReason::RdmaFrags), Some(r)) => {
                    if let Some(cp) = r.cp.filter(|cp| cp.max_frags < frags && cp.max_frags > 0) {
                        if let Some(p) = self.peers.get_mut(&peer) {
                            p.max_frags = cp.max_frags;
                        }
                        retry = true;
                    }
                }
                _ => {}
            },
            _ => {}
        }
        // Only retry while something still waits and no passive accept settles it.
        let wanted = self.peers.get(&peer).is_some_and(|p| !p.pending.is_empty() && p.accepting == 0);
        self.close_conn_only(now, key, e);
        if retry && wanted {
            self.reconnect_after_reject(now, peer);
        }
        self.fail_pending_if_unreachable(now, peer, e);
    }

    /// Retries a rejected attempt (`kiblnd_check_reconnect` marks the connection, connd
    /// reconnects when it destroys it): at once for the first [`QUICK_RECONNECTS`] since the
    /// peer was last connected, then a second apart; the transmits waiting for the peer wait
    /// for the reconnect (until their deadlines). Another attempt still under way settles it.
    ///
    /// [`QUICK_RECONNECTS`]: super::peer::QUICK_RECONNECTS
    fn reconnect_after_reject(&mut self, now: Instant, nid: Nid) {
        let Some(p) = self.peers.get_mut(&nid) else { return };
        if p.connecting > 0 || p.accepting > 0 {
            return;
        }
        let at = p.schedule_reconnect(now);
        if at <= now {
            self.connect_peer(now, nid);
        } else {
            self.reconnect_check = Instant::min_deadline(self.reconnect_check, Some(at));
        }
    }
}
