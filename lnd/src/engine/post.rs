//! Posting (`kiblnd_check_sends`, `kiblnd_post_tx_locked`): what the credit machine lets go
//! on a connection is packed with the credits it returns and posted, RDMA WRITEs first and
//! the SEND behind them; NOOPs are made here when credits are owed.

use lnet_shim::event::Errno;
use lnet_shim::lnd::Health;

use super::conn::ConnState;
use super::tx::{self, Upper, WrKind};
use super::{Engine, err};
use crate::fabric::{Device, FabricError, QueuePair};
use crate::time::Instant;
use crate::wire::IBLND_MSG_SIZE;

impl<D: Device> Engine<D> {
    /// Posts whatever the credit machine allows on a connection (`kiblnd_check_sends`).
    pub(super) fn check_sends(&mut self, now: Instant, key: usize) {
        use crate::credits::Next;
        loop {
            let keepalive = self.cfg.tunables.keepalive_interval();
            let Some(conn) = self.conns.get_mut(key) else { return };
            if conn.state != ConnState::Established {
                return;
            }
            let keepalive_due = keepalive.is_some_and(|ka| now >= conn.last_send + ka);
            match conn.credits.next(keepalive_due) {
                Next::Stop => return,
                Next::NeedNoop => {
                    let peer = conn.peer;
                    match self.new_tx(now, peer, crate::wire::MsgType::Noop, Upper::None) {
                        Some(tx) => {
                            if let Some(t) = self.txs.get_mut(tx) {
                                t.noop = true;
                                t.queued = true;
                                t.conn = Some(key);
                                t.class = crate::credits::TxClass::NoCredit;
                            }
                            let nob = self.init_body(tx, crate::wire::init_noop);
                            self.set_nob(tx, nob);
                            if let Some(c) = self.conns.get_mut(key) {
                                c.credits.enqueue_noop(tx);
                            }
                        }
                        None => {
                            if let Some(c) = self.conns.get_mut(key) {
                                if !c.noop_starved {
                                    c.noop_starved = true;
                                    self.noop_starved.push(key);
                                }
                            }
                            return;
                        }
                    }
                }
                Next::DropNoop(tx) => {
                    if let Some(t) = self.txs.get_mut(tx) {
                        t.queued = false;
                    }
                    self.tx_maybe_done(tx);
                }
                Next::Post { tx, credits, credited } => {
                    if let Err(e) = self.post_tx(now, key, tx, credits) {
                        let noop = self.txs.get(tx).is_some_and(|t| t.noop);
                        if let Some(c) = self.conns.get_mut(key) {
                            c.credits.unpost(credits, credited, noop);
                        }
                        let _ = e;
                        self.abort_tx(tx, err(Errno::EIO, Health::LocalError));
                        self.close_conn(now, key, err(Errno::EIO, Health::LocalError));
                        return;
                    }
                }
            }
        }
    }

    /// Packs the header (with the credits it returns) and posts the RDMA WRITEs and the SEND.
    pub(super) fn post_tx(
        &mut self,
        now: Instant,
        key: usize,
        txk: usize,
        credits: u32,
    ) -> Result<(), FabricError> {
        use crate::fabric::{SendFlags, SendOp, SendWr};
        let Some(conn) = self.conns.get_mut(key) else {
            return Err(FabricError::NotFound { what: "connection" });
        };
        let Some(tx) = self.txs.get_mut(txk) else { return Err(FabricError::NotFound { what: "transmit" }) };
        let hdr = crate::wire::MsgHeader {
            version: crate::wire::IBLND_MSG_VERSION,
            msg_type: tx.msg_type,
            credits: credits.min(255) as u8,
            nob: tx.nob,
            cksum: 0,
            srcnid: self.cfg.nid,
            srcstamp: self.cfg.incarnation,
            dstnid: conn.peer,
            dststamp: conn.peer_incarnation,
        };
        let off = tx.slot as usize * IBLND_MSG_SIZE;
        let nob = tx.nob as usize;
        let msg = self.scratch.get_mut(..nob).ok_or(FabricError::InvalidArgument { what: "message size" })?;
        // Without a checksum only the header is written (`pack_header`'s contract): the body
        // stays where `build_*` put it, and only the 48 header bytes go back and forth.
        let cksum = self.cfg.tunables.cksum;
        let touched = if cksum { nob } else { crate::wire::MSG_HDR_SIZE.min(nob) };
        let _ = self.msgs.buf().read(off, msg.get_mut(..touched).unwrap_or_default());
        crate::wire::pack_header(msg, &hdr, cksum)
            .map_err(|_| FabricError::InvalidArgument { what: "message header" })?;
        let _ = self.msgs.buf().write(off, msg.get(..touched).unwrap_or_default());
        let send_sge = [self.msgs.sge(off, tx.nob)];
        let send = SendWr {
            wr_id: tx::wr_id(WrKind::Tx, tx.generation, txk as u32),
            op: SendOp::Send,
            sg_list: &send_sge,
            flags: SendFlags::SIGNALED,
        };
        if tx.rdma.is_empty() {
            // Most messages: the SEND alone, no list to build.
            conn.qp.post_send_at(std::slice::from_ref(&send), now)?;
        } else {
            let rdma_id = tx::wr_id(WrKind::Rdma, tx.generation, txk as u32);
            let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(tx.rdma.len() + 1);
            for w in &tx.rdma {
                wrs.push(SendWr {
                    wr_id: rdma_id,
                    op: SendOp::RdmaWrite { remote_addr: w.remote_addr, rkey: w.rkey },
                    sg_list: &w.sges,
                    flags: SendFlags::UNSIGNALED,
                });
            }
            wrs.push(send);
            conn.qp.post_send_at(&wrs, now)?;
        }
        let rdma_bytes: u64 = tx.rdma.iter().flat_map(|w| w.sges.iter()).map(|s| u64::from(s.length)).sum();
        tx.sending += 1;
        tx.queued = false;
        conn.sending += 1;
        conn.last_send = now;
        if !conn.active_txs.contains(&txk) {
            // A PUT's PUT_DONE is posted by the transmit that posted its PUT_REQ.
            conn.active_txs.push(txk);
        }
        self.stats.tx_msgs += 1;
        self.stats.tx_bytes += u64::from(tx.nob);
        self.stats.rdma_bytes += rdma_bytes;
        if tx.noop {
            self.stats.noops += 1;
        }
        Ok(())
    }
}
