//! Sending: choosing the message type, filling descriptors, queueing on a connection, and
//! building RDMA WRITE work requests (`kiblnd_send`, `kiblnd_launch_tx`, `kiblnd_init_rdma`).
//!
//! A PUT or REPLY whose header and payload fit a 4 KiB message goes IMMEDIATE (copied); a larger
//! one sends a PUT_REQ and moves the payload by RDMA WRITE once the sink's PUT_ACK names where.
//! A GET that names its sink sends a GET_REQ carrying the sink's RDMA descriptor and the peer
//! writes the reply into it (even a small reply, so that a GET matching nothing is answered
//! with an error); a GET without a sink goes as a header-only IMMEDIATE and the peer's LNet
//! answers with a REPLY message. The LND never issues RDMA READ.

use lnet_shim::buffer::Buffer;
use lnet_shim::event::Errno;
use lnet_shim::hdr::LnetMsgType;
use lnet_shim::lnd::{Frag, Frags, Health, LndError, LndSend, frags_len};
use lnet_shim::nid::Nid;

use super::conn::ConnState;
use super::tx::{RdmaWr, Tx, Upper};
use super::{Engine, Waiting, err};
use crate::credits::TxClass;
use crate::fabric::dma::{RegKeys, register_cached};
use crate::fabric::{Access, Device, Sge};
use crate::time::Instant;
use crate::wire::{IBLND_MAX_IMMEDIATE, IBLND_MSG_SIZE, LNET_HDR_SIZE, MsgType, RdmaFrag, WireError};

/// How an LNet buffer that RDMA WRITEs read from is registered: no remote access (a peer's
/// stale or guessed rkey cannot write into it).
pub(crate) const SOURCE_ACCESS: Access = Access::NONE;
/// How an LNet buffer that RDMA WRITEs land in (a sink named in a PUT_ACK or GET_REQ) is
/// registered: cached for the buffer's life, or for one transfer (`fmr_cache=0`; [`super::sink`]).
pub(crate) const SINK_ACCESS: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// Why an RDMA transfer could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RdmaSetupError {
    /// More work requests than the negotiated fragment count ("RDMA has too many fragments").
    TooManyFragments,
    /// The sink is smaller than the data.
    SinkTooSmall,
    /// The source holds less than the data (a sink describing more than the payload).
    SourceTooSmall,
}

/// Builds the RDMA WRITEs moving `nob` bytes from `src` into `dst` (`kiblnd_init_rdma`): each
/// SGE covers what is left of the current source and destination fragments; a new work request
/// starts when the destination fragment changes or after `wrq_sge` SGEs; more than `max_frags`
/// work requests is an error.
pub(crate) fn plan_rdma(
    src: &[Sge],
    dst_key: u32,
    dst: &[RdmaFrag],
    nob: u64,
    wrq_sge: usize,
    max_frags: usize,
) -> Result<Vec<RdmaWr>, RdmaSetupError> {
    let mut wrs: Vec<RdmaWr> = Vec::new();
    let (mut si, mut soff) = (0usize, 0u64);
    let (mut di, mut doff) = (0usize, 0u64);
    let mut left = nob;
    let mut new_wr = true;
    while left > 0 {
        let Some(s) = src.get(si) else { return Err(RdmaSetupError::SourceTooSmall) };
        let Some(d) = dst.get(di) else { return Err(RdmaSetupError::SinkTooSmall) };
        let s_left = u64::from(s.length) - soff;
        let d_left = u64::from(d.nob) - doff;
        if s_left == 0 {
            si += 1;
            soff = 0;
            continue;
        }
        if d_left == 0 {
            di += 1;
            doff = 0;
            new_wr = true;
            continue;
        }
        let n = s_left.min(d_left).min(left);
        let sge = Sge { addr: s.addr + soff, length: n as u32, lkey: s.lkey };
        let full = wrs.last().is_some_and(|w| w.sges.len() >= wrq_sge.max(1));
        if new_wr || full {
            if wrs.len() >= max_frags {
                return Err(RdmaSetupError::TooManyFragments);
            }
            wrs.push(RdmaWr { remote_addr: d.addr + doff, rkey: dst_key, sges: Vec::with_capacity(wrq_sge) });
            new_wr = false;
        }
        if let Some(w) = wrs.last_mut() {
            w.sges.push(sge);
        }
        soff += n;
        doff += n;
        left -= n;
    }
    Ok(wrs)
}

/// The checks a send must pass before it is accepted: a peer on this network, a payload whose
/// size matches the header (none for a GET), fragments inside their buffers.
pub fn validate_send(me: Nid, msg: &LndSend) -> Result<(), LndError> {
    if msg.target.net() != me.net() || msg.target.is_any() || msg.target == me {
        return Err(err(Errno::EHOSTUNREACH, Health::LocalError));
    }
    let payload = frags_len(&msg.payload).ok_or(err(Errno::EINVAL, Health::LocalError))?;
    // A GET carries no payload (its data comes back in the REPLY): one with a payload would
    // go as a PUT_REQ that no peer can sink.
    let get_with_payload = msg.hdr.msg_type() == LnetMsgType::Get && payload != 0;
    if payload != msg.hdr.payload_length as usize
        || get_with_payload
        || !msg.payload.iter().all(Frag::is_valid)
        || !msg.get_sink.iter().flatten().all(Frag::is_valid)
    {
        return Err(err(Errno::EINVAL, Health::LocalError));
    }
    Ok(())
}

impl<D: Device> Engine<D> {
    /// Accepts a message from LNet (`lnd_send`). Fails at once only for a bad request, after
    /// shutdown, or while the port is down or the device failed ([`super::link`]);
    /// otherwise the outcome comes through `send_done`.
    pub fn send(&mut self, now: Instant, msg: LndSend) -> Result<(), LndError> {
        if self.shutdown {
            return Err(err(Errno::ESHUTDOWN, Health::LocalDropped));
        }
        if let Some(e) = self.link.refusal() {
            self.stats.sends_refused_link += 1;
            return Err(e);
        }
        validate_send(self.cfg.nid, &msg)?;
        self.launch(now, msg);
        Ok(())
    }

    /// Turns an accepted send into a transmit (or waits for a descriptor).
    pub(super) fn launch(&mut self, now: Instant, msg: LndSend) {
        if self.shutdown {
            self.upcalls.send_done(msg.token, Err(err(Errno::ESHUTDOWN, Health::LocalDropped)));
            return;
        }
        // First come, first served: behind earlier waiting sends, and never into the reserve
        // kept for replies.
        let sends_waiting = self.waiting.iter().any(|w| matches!(w, Waiting::Send(_)));
        if sends_waiting || self.slots.available() <= self.reply_reserve() {
            self.stats.tx_pool_waits += 1;
            self.waiting.push_back(Waiting::Send(msg));
            return;
        }
        self.launch_now(now, msg);
    }

    /// [`Engine::launch`] for a send whose turn has come (it takes a descriptor if one is
    /// free, or goes back to the head of the queue).
    pub(super) fn launch_now(&mut self, now: Instant, msg: LndSend) {
        let payload_len = frags_len(&msg.payload).unwrap_or(usize::MAX);
        let sink_len = msg.get_sink.as_deref().and_then(frags_len);
        let kind = msg.hdr.msg_type();
        let hdr = msg.hdr.encode();
        // A GET that names its sink always goes as GET_REQ, however small: the reply is written
        // into the sink and a GET that matches nothing comes back as GET_DONE(-ENODATA).
        // (o2iblnd sends GETs whose reply fits a message as header-only IMMEDIATEs and lets the
        // peer's LNet send a REPLY; a dropped one is then never answered.)
        let rdma_get = kind == LnetMsgType::Get && sink_len.is_some();
        let msg_type = if rdma_get {
            MsgType::GetReq
        } else if payload_len <= IBLND_MAX_IMMEDIATE {
            MsgType::Immediate
        } else {
            MsgType::PutReq
        };
        let Some(txk) = self.new_tx(now, msg.target, msg_type, Upper::Send(msg.token)) else {
            self.waiting.push_front(Waiting::Send(msg));
            return;
        };
        let built = match msg_type {
            MsgType::Immediate => self.build_immediate(txk, &hdr, &msg.payload),
            MsgType::PutReq => self.build_putreq(txk, &hdr, &msg.payload),
            _ => self.build_getreq(txk, &hdr, msg.get_sink.as_deref().unwrap_or_default()),
        };
        match built {
            Ok(()) => self.queue_for_peer(now, msg.target, txk),
            Err(e) => {
                if let Some(t) = self.txs.get_mut(txk) {
                    t.fail(e);
                }
                self.tx_maybe_done(txk);
            }
        }
    }

    /// A fresh descriptor with a message slot, or `None` when the pool is empty.
    pub(super) fn new_tx(
        &mut self,
        now: Instant,
        peer: Nid,
        msg_type: MsgType,
        upper: Upper,
    ) -> Option<usize> {
        let slot = self.slots.take()?;
        let generation = self.alloc_gen();
        let deadline = now + self.tx_timeout();
        let class = match msg_type {
            MsgType::PutReq | MsgType::GetReq => TxClass::Request,
            MsgType::Immediate => TxClass::Credited,
            _ => TxClass::NoCredit,
        };
        let key = self.txs.insert(Tx {
            generation,
            slot,
            peer,
            conn: None,
            msg_type,
            nob: 0,
            class,
            noop: false,
            queued: false,
            sending: 0,
            waiting: false,
            answered: false,
            status: Ok(0),
            reply_len: None,
            cookie: 0,
            deadline,
            upper,
            source: Vec::new(),
            rdma: Vec::new(),
            sink_reg: None,
            pinned: Frags::new(),
        });
        self.tx_check = Instant::min_deadline(self.tx_check, Some(deadline));
        Some(key)
    }

    /// Runs `f` on the transmit's message body area (the slot, header excluded) and returns the
    /// message size it reports.
    pub(super) fn init_body(
        &mut self,
        txk: usize,
        f: impl FnOnce(&mut [u8]) -> Result<u32, WireError>,
    ) -> u32 {
        let Some(slot) = self.txs.get(txk).map(|t| t.slot) else { return 0 };
        let mut buf = std::mem::take(&mut self.scratch);
        buf.resize(IBLND_MSG_SIZE, 0);
        let nob = f(&mut buf).unwrap_or(0);
        let _ = self
            .msgs
            .buf()
            .write(slot as usize * IBLND_MSG_SIZE, buf.get(..nob as usize).unwrap_or_default());
        self.scratch = buf;
        nob
    }

    pub(super) fn set_nob(&mut self, txk: usize, nob: u32) {
        if let Some(t) = self.txs.get_mut(txk) {
            t.nob = nob;
        }
    }

    fn build_immediate(
        &mut self,
        txk: usize,
        hdr: &[u8; LNET_HDR_SIZE],
        payload: &[Frag],
    ) -> Result<(), LndError> {
        let Some(slot) = self.txs.get(txk).map(|t| t.slot) else {
            return Err(err(Errno::EINVAL, Health::LocalError));
        };
        let base = slot as usize * IBLND_MSG_SIZE;
        let len = frags_len(payload).unwrap_or(usize::MAX);
        let nob = self.init_body(txk, |buf| {
            crate::wire::init_immediate(buf, hdr)?;
            crate::wire::immediate_nob(len)
        });
        if nob == 0 {
            return Err(err(Errno::EMSGSIZE, Health::LocalError));
        }
        // Gather the payload straight into the registered message buffer.
        let mut at = base + crate::wire::MSG_HDR_SIZE + LNET_HDR_SIZE;
        for f in payload {
            self.msgs
                .buf()
                .copy_from(at, &f.buf, f.offset, f.len)
                .map_err(|_| err(Errno::EINVAL, Health::LocalError))?;
            at += f.len;
        }
        self.set_nob(txk, nob);
        if let Some(t) = self.txs.get_mut(txk) {
            t.status = Ok(len);
        }
        Ok(())
    }

    /// Registers (or finds the registration of) each fragment's buffer and returns SGEs.
    pub(super) fn local_sges(&mut self, frags: &[Frag]) -> Result<Vec<Sge>, LndError> {
        let mut sges = Vec::with_capacity(frags.len());
        for f in frags.iter().filter(|f| f.len > 0) {
            if f.len > u32::MAX as usize {
                return Err(err(Errno::EMSGSIZE, Health::LocalError));
            }
            // An RDMA source: read locally only, so registered without remote access.
            let keys = self.keys_of(&f.buf, SOURCE_ACCESS)?;
            sges.push(Sge { addr: f.buf.addr() + f.offset as u64, length: f.len as u32, lkey: keys.lkey });
        }
        Ok(sges)
    }

    /// The keys of `buf`'s cached registration with `access`, registering it on first use.
    pub(super) fn keys_of(&self, buf: &Buffer, access: Access) -> Result<RegKeys, LndError> {
        register_cached(&self.dev, &self.pd, self.owner, buf, access)
            .map_err(|_| err(Errno::ENOMEM, Health::LocalError))
    }

    fn build_putreq(
        &mut self,
        txk: usize,
        hdr: &[u8; LNET_HDR_SIZE],
        payload: &[Frag],
    ) -> Result<(), LndError> {
        let sges = self.local_sges(payload)?;
        let cookie = self.alloc_cookie();
        let nob = self.init_body(txk, |buf| crate::wire::init_putreq(buf, hdr, cookie));
        self.cookies.insert(cookie, txk);
        self.set_nob(txk, nob);
        let len = frags_len(payload).unwrap_or(0);
        if let Some(t) = self.txs.get_mut(txk) {
            t.cookie = cookie;
            t.waiting = true;
            t.source = sges;
            t.pinned = payload.iter().cloned().collect();
            t.status = Ok(len);
        }
        Ok(())
    }

    fn build_getreq(&mut self, txk: usize, hdr: &[u8; LNET_HDR_SIZE], sink: &[Frag]) -> Result<(), LndError> {
        let len = frags_len(sink).unwrap_or(0);
        let rd = self.sink_rd(sink, len)?;
        let cookie = self.alloc_cookie();
        let nob = self.init_body(txk, |buf| crate::wire::init_get(buf, hdr, cookie, rd.key, &rd.frags));
        if nob == 0 {
            return Err(err(Errno::EMSGSIZE, Health::LocalError));
        }
        self.cookies.insert(cookie, txk);
        self.set_nob(txk, nob);
        if let Some(t) = self.txs.get_mut(txk) {
            t.cookie = cookie;
            t.waiting = true;
            t.sink_reg = rd.reg;
            t.pinned = sink.iter().cloned().collect();
        }
        Ok(())
    }

    /// Queues a transmit on an established connection of `peer`, or on the peer while it
    /// connects (`kiblnd_launch_tx`).
    pub(super) fn queue_for_peer(&mut self, now: Instant, peer: Nid, txk: usize) {
        let q = self.cfg.tunables.peer_credits;
        let p = self.peers.entry(peer).or_insert_with(|| super::peer::Peer::new(peer, q));
        // Counted, then picked, without a list of them: this runs for every message.
        let established = super::conn::established(&self.conns, &p.conns).count();
        if established == 0 {
            p.pending.push_back(txk);
            if let Some(t) = self.txs.get_mut(txk) {
                t.queued = true;
            }
            // Under way already, or a reconnect after a reject is due: it waits for that.
            let connecting = p.connecting > 0 || p.accepting > 0 || p.reconnect_at.is_some();
            if !connecting {
                self.connect_peer(now, peer);
            }
            return;
        }
        p.rr = p.rr.wrapping_add(1);
        let key =
            super::conn::established(&self.conns, &p.conns).nth(p.rr % established).map_or(0, |(k, _)| k);
        self.queue_on_conn(key, txk);
    }

    /// Queues a transmit on a connection's credit queues.
    pub(super) fn queue_on_conn(&mut self, key: usize, txk: usize) {
        if self.conns.get(key).is_none_or(|c| c.state != ConnState::Established) {
            // `kiblnd_queue_tx_locked` on a dead connection: a closing one's queues were
            // drained when it closed, so a transmit queued now would wait for its deadline.
            self.abort_tx(txk, err(Errno::ECONNABORTED, Health::LocalError));
            return;
        }
        let Some(t) = self.txs.get_mut(txk) else { return };
        let Some(c) = self.conns.get_mut(key) else { return };
        t.conn = Some(key);
        t.queued = true;
        c.credits.enqueue(txk, t.class);
        self.dirty.insert(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(addr: u64, length: u32) -> Sge {
        Sge { addr, length, lkey: 1 }
    }

    fn frag(addr: u64, nob: u32) -> RdmaFrag {
        RdmaFrag { addr, nob }
    }

    #[test]
    fn one_contiguous_source_and_sink_is_one_write() {
        let wrs = plan_rdma(&[sge(0x1000, 1 << 20)], 9, &[frag(0x9000, 1 << 20)], 1 << 20, 2, 257).unwrap();
        assert_eq!(wrs, vec![RdmaWr { remote_addr: 0x9000, rkey: 9, sges: vec![sge(0x1000, 1 << 20)] }]);
    }

    #[test]
    fn writes_split_at_sink_fragments_and_wrq_sge() {
        // Source: 4 pieces of 100; sink: 250 + 150.
        let src = [sge(0, 100), sge(1000, 100), sge(2000, 100), sge(3000, 100)];
        let dst = [frag(0x10, 250), frag(0x900, 150)];
        let wrs = plan_rdma(&src, 5, &dst, 400, 2, 257).unwrap();
        let shape: Vec<(u64, Vec<(u64, u32)>)> = wrs
            .iter()
            .map(|w| (w.remote_addr, w.sges.iter().map(|s| (s.addr, s.length)).collect()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0x10, vec![(0, 100), (1000, 100)]),
                (0x10 + 200, vec![(2000, 50)]),
                (0x900, vec![(2050, 50), (3000, 100)]),
            ]
        );
    }

    #[test]
    fn too_many_fragments_and_short_sinks_are_errors() {
        let src: Vec<Sge> = (0..10).map(|i| sge(i * 4096, 4096)).collect();
        let dst: Vec<RdmaFrag> = (0..10).map(|i| frag(i * 8192, 4096)).collect();
        assert_eq!(plan_rdma(&src, 1, &dst, 40960, 2, 4), Err(RdmaSetupError::TooManyFragments));
        assert_eq!(plan_rdma(&src, 1, &dst[..2], 40960, 2, 257), Err(RdmaSetupError::SinkTooSmall));
        assert_eq!(plan_rdma(&src[..2], 1, &dst, 40960, 2, 257), Err(RdmaSetupError::SourceTooSmall));
        assert!(plan_rdma(&src, 1, &dst, 0, 2, 257).unwrap().is_empty());
    }

    #[test]
    fn sends_that_no_peer_could_take_are_refused() {
        use crate::engine::tests::{filled, get_hdr, put_hdr};
        let (me, peer) = (Nid::o2ib([10, 0, 0, 1].into()), Nid::o2ib([10, 0, 0, 2].into()));
        let send = |hdr, payload: Frags| LndSend { target: peer, hdr, payload, get_sink: None, token: 1 };
        let errno = |m: &LndSend| validate_send(me, m).map_err(|e| e.errno);
        assert_eq!(errno(&send(put_hdr(me, peer, 1, 100), Frag::whole(filled(1, 100)).into())), Ok(()));
        // The header's payload length and the payload differ.
        assert_eq!(
            errno(&send(put_hdr(me, peer, 1, 99), Frag::whole(filled(1, 100)).into())),
            Err(Errno::EINVAL)
        );
        // A GET with a payload: it would go as a PUT_REQ that the peer cannot sink.
        let mut get = get_hdr(me, peer, 1, 8192);
        get.payload_length = 8192;
        assert_eq!(errno(&send(get, Frag::whole(filled(1, 8192)).into())), Err(Errno::EINVAL));
        assert_eq!(errno(&send(get_hdr(me, peer, 1, 8192), Frags::new())), Ok(()));
        // Ourselves, another network.
        let to_me = LndSend { target: me, ..send(put_hdr(me, me, 1, 0), Frags::new()) };
        assert_eq!(errno(&to_me), Err(Errno::EHOSTUNREACH));
        let tcp = LndSend {
            target: "10.0.0.2@tcp".parse().unwrap(),
            ..send(put_hdr(me, peer, 1, 0), Frags::new())
        };
        assert_eq!(errno(&tcp), Err(Errno::EHOSTUNREACH));
    }
}
